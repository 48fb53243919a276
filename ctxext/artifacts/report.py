"""The typed schema of an evaluation report (``report.json``): written by ``ctxext eval``, read by card, merge, push.

One definition of what a report holds, so the writer and every reader agree (pydantic v2)::

    EvalReport: schema ("ctxext.eval.report/v1"), ctxext_version, created, suite, command, environment, data,
                models: [ModelEntry], comparisons: Comparisons | None
    ModelEntry: name, model (how it was loaded), rope (its RoPE), and one section per task that ran:
                perplexity, passkey / needle (retrieval grids), ruler, attention, qa, harness (lm-eval),
                longppl (perplexity on key tokens)

Sections accept fields they do not declare (``extra="allow"``) and keep them on a round trip: a report's
fields are only ever added, never renamed, so a report written by a newer ctxext of the same schema
version still reads. A report of another schema version, or a JSON file that is not a ctxext report,
is refused with a message that says what to do.

Units: ``nll`` is nats per token and ``ppl = exp(nll)``; ``ci_low`` / ``ci_high`` bound the perplexity (95 %
bootstrap over documents) or the accuracy (95 % Wilson); accuracies are fractions in [0, 1]; QA's EM / F1
are percentages. JSON has no NaN: a number that could not be measured is ``null``.

Values are checked against their range on every read and write (a perplexity below 1, an accuracy above 1, more
correct trials than trials, a NaN in the file: a report that was edited or damaged), so a card never shows them.
In memory an evaluator may hold NaN for a value it could not measure; the file holds ``null``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


class Section(BaseModel):
    """A part of a report: declared fields are typed; fields added by newer versions are kept as they are."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# ---------------------------------------------------------------------------------------------
# Perplexity
# ---------------------------------------------------------------------------------------------


class PplEntry(Section):
    """Perplexity over a set of tokens (a length, a position bucket, a context limit)."""

    ppl: PplValue = None
    nll: NllValue = None
    tokens: Count = None
    documents: Count = None
    ci_low: PplValue = None
    ci_high: PplValue = None


class PplLength(PplEntry):
    """Perplexity at one evaluation length; ``beyond_context``: the length is past the model's context."""

    beyond_context: bool = False


class PplBucket(PplEntry):
    """Perplexity of the tokens at positions ``start`` (included) to ``end`` (excluded)."""

    start: int
    end: int


class ShortContext(PplEntry):
    """Perplexity at the model's original context length (the cost of the extension inside it)."""

    length: int


class ContextUse(Section):
    """The same target tokens scored with their context cut to k tokens (``limits``) and in full."""

    targets: dict[str, Any]
    full: PplEntry
    limits: list[dict[str, Any]] = Field(default_factory=list)
    original_window: int | None = None


class PplDocuments(Section):
    """How many documents were read, skipped as too short, and evaluated."""

    read: int | None = None
    too_short: int | None = None
    min_tokens: int | None = None
    evaluated: int | None = None
    common: int | None = None
    per_length: dict[str, int] = Field(default_factory=dict)


class Perplexity(Section):
    """The ``perplexity`` section of a model: by evaluation length, by token position, by context limit."""

    protocol: str | None = None
    mode: str | None = None
    document_set: str | None = None
    by_length: dict[str, PplLength]
    by_length_all: dict[str, PplLength] = Field(default_factory=dict)
    per_document: dict[str, Any] | None = None
    by_bucket: list[PplBucket] = Field(default_factory=list)
    bucket_length: int | None = None
    bucket_documents: int | None = None
    short_context: ShortContext | None = None
    context_use: ContextUse | None = None
    documents: PplDocuments = Field(default_factory=PplDocuments)
    settings: dict[str, Any] = Field(default_factory=dict)

    def ppl_at(self, length: int) -> float | None:
        """The perplexity at an evaluation length, if measured."""
        entry = self.by_length.get(str(length))
        return entry.ppl if entry else None


# ---------------------------------------------------------------------------------------------
# Retrieval grids
# ---------------------------------------------------------------------------------------------


class TeacherForced(Section):
    """Teacher-forced outcomes: trials whose every answer token is the argmax (exact for greedy decoding)."""

    correct: int = Field(ge=0)
    trials: int = Field(ge=0)
    accuracy: Fraction = None

    @model_validator(mode="after")
    def _correct_within_trials(self) -> TeacherForced:
        if self.correct > self.trials:
            raise ValueError(f"correct: {self.correct} correct trials out of {self.trials}")
        return self


class Generated(Section):
    """RULER's string-match score of greedy generations (a fraction; RULER prints it × 100).

    ``metric``: ``string_match_all`` (per trial, the fraction of reference strings found) or
    ``string_match_part`` (1 if any is found); ``scores``: each trial's (cells only).
    """

    metric: str
    score: Fraction = None
    trials: int = Field(ge=0)
    scores: list[Fraction] = Field(default_factory=list)


class Accuracy(Section):
    """Correct trials out of a number of trials, with a 95 % Wilson interval.

    Where both scorings ran, ``teacher_forced`` and ``generated`` hold each (absent in
    older reports and where that scoring did not run).
    """

    correct: int = Field(ge=0)
    trials: int = Field(ge=0)
    accuracy: Fraction = None
    ci_low: Fraction = None
    ci_high: Fraction = None
    teacher_forced: TeacherForced | None = None
    generated: Generated | None = None

    @model_validator(mode="after")
    def _correct_within_trials(self) -> Accuracy:
        if self.correct > self.trials:
            raise ValueError(f"correct: {self.correct} correct trials out of {self.trials}")
        return self


class GridCell(Accuracy):
    """One (length, depth) cell of a retrieval grid, with each trial's outcome (for paired tests)."""

    length: int = Field(gt=0)
    depth: float = Field(ge=0, le=100)
    score: Fraction = None
    beyond_context: bool = False
    outcomes: list[int] = Field(default_factory=list)
    examples: list[dict[str, Any]] = Field(default_factory=list)


class Grid(Section):
    """A retrieval task (passkey, needle, a RULER-style task) scored over lengths × depths.

    ``scoring`` is ``teacher-forced`` or ``generate``; ``None`` in reports written before scoring modes existed
    (they generated).
    """

    task: str | None = None
    registry_task: str | None = None
    scoring: str | None = None
    chat_template: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    cells: list[GridCell]
    by_length: dict[str, Accuracy] = Field(default_factory=dict)
    by_depth: dict[str, Accuracy] = Field(default_factory=dict)
    overall: Accuracy | None = None

    def lengths(self) -> list[int]:
        """The evaluated lengths, ascending."""
        return sorted({c.length for c in self.cells})

    def depths(self) -> list[float]:
        """The evaluated depths (percent), ascending."""
        return sorted({c.depth for c in self.cells})

    def accuracy_at(self, length: int) -> float | None:
        """Accuracy over all depths at one length (all trials pooled)."""
        agg = self.by_length.get(str(length))
        if agg is not None and agg.accuracy is not None:
            return agg.accuracy
        cells = [c for c in self.cells if c.length == length]
        trials = sum(c.trials for c in cells)
        return sum(c.correct for c in cells) / trials if trials else None


class EffectiveLength(Section):
    """RULER's effective length: the longest length up to which every length scores at least ``threshold``.

    ``name``: the definition's label in the named ones (``RULER (≥ 85.6)``, ``NoLiMa (≥ 85 % of own short score)``).
    """

    length: int | None = None
    threshold: float | None = None
    reference_score: float | None = None
    name: str | None = None
    note: str | None = None


# scoring (teacher_forced / generated) → definition (ruler / nolima) → effective length
NamedEffectiveLengths = dict[str, dict[str, EffectiveLength]]


class GridControl(Section):
    """The no-needle control of a task: its prompts with every insert replaced by haystack text (chance rate).

    Only ``note`` where the task inserts nothing.
    """

    note: str | None = None
    depth: float | None = None
    by_length: dict[str, Accuracy] = Field(default_factory=dict)
    overall: Accuracy | None = None


class RulerTask(Grid):
    """One task of a RULER-style suite, with its effective length (the section's setting, and both named ones).

    ``control``: the no-needle control, where the section ran it (``control: true``).
    """

    effective_length: EffectiveLength = Field(default_factory=EffectiveLength)
    effective_lengths: NamedEffectiveLengths = Field(default_factory=dict)
    control: GridControl | None = None


class Ruler(Section):
    """The ``ruler`` section: per-task grids, score by task × length, effective lengths."""

    settings: dict[str, Any] = Field(default_factory=dict)
    original_length: int | None = None
    haystack: str | None = None
    scoring: str | None = None
    tasks: dict[str, RulerTask]
    scores: dict[str, dict[str, float]] = Field(default_factory=dict)
    mean_by_length: dict[str, float] = Field(default_factory=dict)
    effective_length: EffectiveLength = Field(default_factory=EffectiveLength)
    trained_tasks: list[str] | None = None
    chat_template: str | None = None
    scores_by: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    mean_by_length_by: dict[str, dict[str, float]] = Field(default_factory=dict)
    effective_lengths: NamedEffectiveLengths = Field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Attention diagnostics, QA, paired comparisons
# ---------------------------------------------------------------------------------------------


class Attention(Section):
    """The ``attention`` section: attention mass by distance band, beyond the original window, on sinks."""

    length: int
    documents: int
    original_length: int
    beyond_context: bool = False
    band_labels: list[str]
    layers: list[dict[str, Any]]
    mean: dict[str, Any]
    position_buckets: list[Any] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)


class QAScores(Section):
    """SQuAD exact match and F1 (percent) over some examples, with 95 % bootstrap intervals."""

    examples: int = Field(ge=0)
    exact_match: Percent = None
    f1: Percent = None
    exact_match_ci: list[float | None] = Field(default_factory=list)
    f1_ci: list[float | None] = Field(default_factory=list)


class QA(Section):
    """The ``qa`` section: long-document QA overall, by answer position and by context length."""

    examples: int
    truncated: int = 0
    prompt_budget: int | None = None
    overall: QAScores
    by_position: dict[str, QAScores] = Field(default_factory=dict)
    by_length: dict[str, QAScores] = Field(default_factory=dict)
    samples: list[dict[str, Any]] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)
    chat_template: str | None = None


class HarnessTask(Section):
    """One task (or group) of a standard harness: its metrics, their standard errors, per-document outcomes."""

    metrics: dict[str, Any] = Field(default_factory=dict)
    stderr: dict[str, float | None] = Field(default_factory=dict)
    documents: int | None = None
    metric: str | None = None
    outcomes: list[float] = Field(default_factory=list)
    examples: list[dict[str, Any]] = Field(default_factory=list)


class Harness(Section):
    """The ``harness`` section: a standard harness (lm-evaluation-harness) run on the loaded, verified model."""

    harness: str
    version: str | None = None
    model_args: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    tasks: dict[str, HarnessTask]
    notes: list[str] = Field(default_factory=list)
    seconds: float | None = None


class LongPPLLength(Section):
    """LongPPL at one length: perplexity on the key tokens, plain perplexity on every token, how many were key."""

    longppl: PplEntry
    ppl: PplEntry
    key_tokens: int
    scored_tokens: int
    key_fraction: float | None = None
    evaluator_mean_lsd: float | None = None
    beyond_context: bool = False
    note: str | None = None


class LongPPL(Section):
    """The ``longppl`` section: perplexity on the tokens that need the far context (Fang et al. 2024).

    ``evaluator``: the model that chose the key tokens (the same tokens for every model of the report);
    ``by_length`` is empty, with a ``note``, for a model that could not be scored on them.
    """

    definition: str | None = None
    evaluator: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    by_length: dict[str, LongPPLLength] = Field(default_factory=dict)
    per_document: dict[str, Any] | None = None
    note: str | None = None


class Comparisons(Section):
    """Paired model-vs-reference statistics (:func:`ctxext.evaluation.paired.compare_models`)."""

    reference: str
    comparisons: int = 0
    correction: str = "holm"
    notes: list[str] = Field(default_factory=list)
    perplexity: list[dict[str, Any]] = Field(default_factory=list)
    grids: list[dict[str, Any]] = Field(default_factory=list)
    attention: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Models and the report
# ---------------------------------------------------------------------------------------------


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


# The task sections of a model entry: a task that did not run has no key (not null).
TASKS = ("perplexity", "passkey", "needle", "ruler", "attention", "qa", "harness", "longppl")


class ModelEntry(Section):
    """One evaluated model: its label, how it was loaded, its RoPE, and a section per task that ran."""

    name: str
    model: ModelInfo = Field(default_factory=ModelInfo)
    rope: RopeInfo
    perplexity: Perplexity | None = None
    passkey: Grid | None = None
    needle: Grid | None = None
    ruler: Ruler | None = None
    attention: Attention | None = None
    qa: QA | None = None
    harness: Harness | None = None
    longppl: LongPPL | None = None

    @property
    def is_base(self) -> bool:
        """The unmodified base model: loaded with neither an adapter nor a patched config."""
        return not self.model.adapter and not self.model.config_from


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

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value != SCHEMA:
            raise ValueError(f"schema {value!r} is not {SCHEMA!r}, the one this ctxext reads")
        return value

    def to_json_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``"schema"`` key, NaN / inf as ``null``, tasks that did not run left out)."""
        data = _plain(self.model_dump(mode="json", by_alias=True), finite=True)
        for entry in data["models"]:
            for task in TASKS:
                if entry.get(task) is None:
                    entry.pop(task, None)
        return data

    def to_json(self) -> str:
        """The ``report.json`` text."""
        return json.dumps(self.to_json_dict(), indent=2, allow_nan=False) + "\n"

    def data_source(self, task: str = "perplexity") -> str | None:
        """The data a task was scored on (``data.<task>.source``), if the report names it."""
        source = (self.data.get(task) or {}).get("source")
        return source if isinstance(source, str) and source else None


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
