"""The typed schema of an evaluation report (``report.json``): written by ``ctxext eval``, read by card, merge, push.

One definition of what a report holds, so the writer and every reader agree (pydantic v2)::

    EvalReport: schema ("ctxext.eval.report/v1"), ctxext_version, created, suite, command, environment, data,
                models: [ModelEntry], comparisons: Comparisons | None, card: {section: CardPart}
    ModelEntry: name, model (how it was loaded), rope (its RoPE), and one part per suite section that ran,
                under the section's name (perplexity, passkey, needle, ruler, qa, attention, harness, longppl …)

The report is open: each suite section registers the schema of its results here (:func:`register_schema`;
``ctxext.evaluation.sections`` does it for every registered section), and a model entry's part of a
registered section is validated with that schema, so a plugin section is typed like a built-in one. A part
whose section is not registered in the reading process is kept as it is. ``card`` holds what each section
shows in a model card, rendered when the report was written, so the card needs no section's code.

Parts accept fields they do not declare (``extra="allow"``) and keep them on a round trip: a report's
fields are only ever added, never renamed, so a report written by a newer ctxext of the same schema
version still reads. A report of another schema version, or a JSON file that is not a ctxext report,
is refused with a message that says what to do.

Units: ``nll`` is nats per token and ``ppl = exp(nll)``; ``ci_low`` / ``ci_high`` bound the perplexity (95 %
bootstrap over documents) or the accuracy (95 % Wilson); accuracies are fractions in [0, 1]; QA's EM / F1
are percentages. JSON has no NaN: a number that could not be measured is ``null``.

Values are checked against their range on every read and write (a perplexity below 1, an accuracy above 1, more
correct trials than trials, a NaN in the file: a report that was edited or damaged), with the value types below
(:data:`PplValue`, :data:`Fraction` …) that the sections' schemas use.
In memory an evaluator may hold NaN for a value it could not measure; the file holds ``null``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from ctxext.errors import InputError

SCHEMA = "ctxext.eval.report/v1"


def _within(low: float | None, high: float | None, meaning: str) -> AfterValidator:
    """A range check that names what the value means; ``None`` and NaN (not measured, ``null`` on disk) pass."""

    def check(value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return value
        if (low is not None and value < low) or (high is not None and value > high):
            bound = f"below {low:g}" if low is not None and value < low else f"above {high:g}"
            raise ValueError(f"{value!r} is {bound}: {meaning}")
        return value

    return AfterValidator(check)


PplValue = Annotated[float | None, _within(1, None, "a perplexity is exp(NLL) with NLL >= 0, so at least 1")]
NllValue = Annotated[float | None, _within(0, None, "an NLL (nats per token) is at least 0")]
Fraction = Annotated[float | None, _within(0, 1, "a fraction (accuracy, score, interval bound) is in [0, 1]")]
Percent = Annotated[float | None, _within(0, 100, "a percentage is in [0, 100]")]
Count = Annotated[int | None, _within(0, None, "a count is at least 0")]

S = TypeVar("S", bound=BaseModel)


class Section(BaseModel):
    """A part of a report: declared fields are typed; fields added by newer versions are kept as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class PplEntry(Section):
    """Perplexity over a set of tokens (a length, a position bucket, a context limit, a set of key tokens)."""

    ppl: PplValue = None
    nll: NllValue = None
    tokens: Count = None
    documents: Count = None
    ci_low: PplValue = None
    ci_high: PplValue = None


# ---------------------------------------------------------------------------------------------
# The sections' schemas (registered by the sections)
# ---------------------------------------------------------------------------------------------

SECTION_SCHEMAS: dict[str, type[BaseModel]] = {}


def register_schema(name: str, schema: type[BaseModel]) -> None:
    """Type a section's part of every model entry with ``schema`` (read and written while it is registered).

    Args:
        name: the section's name (its key in a model entry).
        schema: the pydantic model of its results (``extra="allow"`` keeps fields a newer version adds).
    """
    SECTION_SCHEMAS[name] = schema


def unregister_schema(name: str) -> None:
    """Stop typing a section's part (it is then kept as it is)."""
    SECTION_SCHEMAS.pop(name, None)


# ---------------------------------------------------------------------------------------------
# Models, comparisons, the card and the report
# ---------------------------------------------------------------------------------------------


class Comparisons(Section):
    """Paired model-vs-reference statistics (``ctxext.evaluation.paired``).

    Each section's rows are a list under its key (``perplexity``, ``grids``, ``attention``, a plugin's name),
    each row with ``model``, ``p_value`` and ``p_holm`` (Holm-adjusted over ``comparisons`` rows).
    """

    reference: str
    comparisons: int = 0
    correction: str = "holm"
    notes: list[str] = Field(default_factory=list)

    def rows(self, key: str) -> list[dict[str, Any]]:
        """The rows stored under ``key`` (none when the report has none)."""
        found = (self.model_extra or {}).get(key)
        return list(found) if isinstance(found, list) else []


class ModelInfo(Section):
    """How a model was loaded: its reference, base, adapter, patched config, dtype, device."""

    ref: str | None = None
    base: str | None = None
    base_path: str | None = None
    adapter: str | None = None
    config_from: str | None = None
    dtype: str | None = None
    device: str | None = None
    attention: str | None = None
    parameters: int | None = None
    rope_verified: bool | None = None
    # The factor on every attention logit (a calibrated run's, ``ctxext calibrate``); None in older reports.
    attention_temperature: float | None = None


class RopeInfo(Section):
    """The model's RoPE as evaluated (``ctxext.rope.types.RopeState`` plus the factor)."""

    rope_type: str
    rope_theta: float
    original_length: int
    current_length: int
    factor: float | None = None


class ModelEntry(Section):
    """One evaluated model: its label, how it was loaded, its RoPE, and a part per suite section that ran.

    A section that did not run has no key (not null). A registered section's part is validated with its schema
    (:func:`register_schema`); read it typed with :meth:`section`.
    """

    name: str
    model: ModelInfo = Field(default_factory=ModelInfo)
    rope: RopeInfo

    @model_validator(mode="after")
    def _typed_sections(self) -> ModelEntry:
        # Each registered section's part through its schema; problems are named by their full path.
        extra = self.__pydantic_extra__ or {}
        problems: list[InitErrorDetails] = []
        for key, value in extra.items():
            schema = SECTION_SCHEMAS.get(key)
            if schema is None or value is None or isinstance(value, schema):
                continue
            try:
                extra[key] = schema.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)
            except ValidationError as exc:
                problems += [
                    InitErrorDetails(type=e["type"], loc=(key, *e["loc"]), input=e.get("input"), ctx=e.get("ctx", {}))
                    for e in exc.errors()
                ]
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    def section(self, name: str, kind: type[S]) -> S | None:
        """A section's part typed as ``kind`` (its schema); ``None`` when the section did not run."""
        value = (self.__pydantic_extra__ or {}).get(name)
        if value is None:
            return None
        return value if isinstance(value, kind) else kind.model_validate(value)

    def has(self, name: str) -> bool:
        """Whether the section ``name`` ran on this model."""
        return (self.__pydantic_extra__ or {}).get(name) is not None

    @property
    def is_base(self) -> bool:
        """The unmodified base model: loaded with neither an adapter nor a patched config."""
        return not self.model.adapter and not self.model.config_from


class CardResult(Section):
    """One result of the model card's Hub metadata (``model-index``): a metric of the extended model at a length."""

    task: str
    dataset_type: str
    dataset_name: str
    metric: str
    label: str
    length: str
    value: float


class CardPart(Section):
    """What one section shows in a model card, rendered by the section when the report was written.

    ``rows``: its lines in the card's evaluation part; ``results``: the extended model's ``model-index`` entries;
    ``cost``: its lines on the extension's short-context cost (extended model against the base), if any.
    """

    rows: list[str] = Field(default_factory=list)
    results: list[CardResult] = Field(default_factory=list)
    cost: list[str] = Field(default_factory=list)


def split_base(models: list[ModelEntry]) -> tuple[ModelEntry | None, ModelEntry | None]:
    """Pick the extended model's entry and the unmodified base's (for the card and the short-context cost).

    Args:
        models: the models of one report.

    Returns:
        ``(extended, base)``; the extended one is the last non-base model (fine-tuned after patched-only).
    """
    base = next((m for m in models if m.is_base), None)
    others = [m for m in models if m is not base]
    return (others[-1] if others else None), base


class EvalReport(BaseModel):
    """A whole ``report.json``: the models evaluated side by side and their paired comparisons."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    # "schema" in the file; a pydantic field cannot be called that (it shadows BaseModel.schema).
    schema_version: str = Field(SCHEMA, alias="schema")
    ctxext_version: str | None = None
    created: str | None = None
    suite: dict[str, Any] | None = None
    command: str | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    data: dict[str, dict[str, Any]] = Field(default_factory=dict)
    models: list[ModelEntry] = Field(min_length=1)
    comparisons: Comparisons | None = None
    # Each section's part of a model card, by section (absent in reports written before the card was stored).
    card: dict[str, CardPart] = Field(default_factory=dict)

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != SCHEMA:
            raise ValueError(f"schema {value!r} is not {SCHEMA!r}, the one this ctxext reads")
        return value

    def to_json_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``"schema"`` key, NaN / inf as ``null``, no section that did not run)."""
        data = _plain(self.model_dump(mode="json", by_alias=True), finite=True)
        for entry in data["models"]:
            for key in [k for k, v in entry.items() if v is None and k not in ModelEntry.model_fields]:
                entry.pop(key)
        return data

    def to_json(self) -> str:
        """The ``report.json`` text."""
        return json.dumps(self.to_json_dict(), indent=2, allow_nan=False) + "\n"

    def data_source(self, section: str) -> str | None:
        """The data a section was scored on (``data.<section>.source``), if the report names it."""
        source = (self.data.get(section) or {}).get("source")
        return source if isinstance(source, str) and source else None

    def data_sources(self) -> list[str]:
        """Every data source the report names, once each, in the sections' order."""
        found = (self.data_source(section) for section in self.data)
        return list(dict.fromkeys(source for source in found if source))


def _plain(obj: Any, finite: bool = False) -> Any:
    # Plain Python data: numpy / torch scalars from the evaluators become numbers, and with ``finite``
    # NaN / inf become null (JSON has neither). In memory a value that could not be measured stays NaN.
    if isinstance(obj, float):
        return obj if not finite or math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _plain(v, finite) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, finite) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return _plain(obj.item(), finite)
    return obj


def parse_report(data: Any, where: str = "the report") -> EvalReport:
    """Validate report data against the schema.

    Args:
        data: the parsed JSON (or the evaluator's dict, numpy scalars allowed).
        where: what to name in messages (a path).

    Returns:
        The typed report.

    Raises:
        InputError: not a ctxext report, another schema version, or fields of the wrong shape (all listed).
    """
    if not isinstance(data, dict):
        raise InputError(f"{where} must hold a JSON object (a ctxext evaluation report), not {type(data).__name__}")
    if "schema" not in data:
        raise InputError(
            f'{where} is not a ctxext evaluation report (it has no "schema" field; ctxext writes '
            f'"schema": "{SCHEMA}"): pass a report.json written by `ctxext eval`, or evaluate again'
        )
    if data["schema"] != SCHEMA:
        raise InputError(
            f"{where} has report schema {data['schema']!r}; this ctxext reads {SCHEMA!r}. Evaluate again with "
            "this version (`ctxext eval run ...`), or read it with the ctxext version that wrote it"
        )
    try:
        return EvalReport.model_validate(_plain(data))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise InputError(
            f"{where} does not match the report schema {SCHEMA} ({problems}); it was edited or damaged: "
            "evaluate again with `ctxext eval`"
        ) from None


def read_report(path: str | Path) -> EvalReport:
    """Read and validate a ``report.json``.

    Args:
        path: the file, or a folder holding ``report.json``.

    Returns:
        The typed report.

    Raises:
        InputError: a missing or unreadable file, or a report that does not match the schema.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise InputError(f"evaluation report {path} does not exist; pass the report.json written by `ctxext eval`")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"evaluation report {path} is not valid JSON ({exc})") from None
    bad = _non_finite(data)
    if bad:
        shown = "; ".join(f"{key}: {value}" for key, value in bad[:5]) + (
            f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        )
        raise InputError(
            f"evaluation report {path} holds numbers JSON does not have ({shown}); ctxext writes a value it could not "
            "measure as null, so the report was edited or damaged: evaluate again with `ctxext eval`"
        )
    return parse_report(data, f"evaluation report {path}")


def _non_finite(obj: Any, where: str = "") -> list[tuple[str, float]]:
    """``(dotted field, value)`` of every NaN / Infinity in parsed JSON (Python reads them; JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return [(where or "(top level)", obj)]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    return [found for key, value in items for found in _non_finite(value, f"{where}.{key}" if where else str(key))]
