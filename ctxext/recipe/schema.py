"""The recipe schema: one YAML file, validated by typed pydantic models that forbid unknown keys.

A recipe has one section per topic (model, rope, quantization, lora, data, train, eval, hub,
output). ``key=value`` arguments override any field by its dotted path. Every problem is reported
at once, each naming its YAML key; a misspelt key is an error, never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from ctxext.errors import InputError
from ctxext.recipe.calibration import CalibrateSection
from ctxext.recipe.memory import MemorySection
from ctxext.recipe.parallel import sequence_parallel_refusal
from ctxext.recipe.sections import (
    RUN_KEEPING,
    DataSection,
    EvalSection,
    HubSection,
    LoraSection,
    ModelSection,
    OutputSection,
    QuantizationSection,
    RopeSection,
    SearchSection,
    Section,
    TrainSection,
    pose_refusal,
)
from ctxext.recipe.window import marked_keys, resolve_window_multiples
from ctxext.rope.methods import declared_options


class RecipeError(InputError, ValueError):
    """A recipe that cannot be used; ``problems`` lists ``(key, message)`` pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        body = "\n".join(f"  {key}: {msg}" for key, msg in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{body}")


class Recipe(Section):
    """A whole recipe."""

    model: ModelSection
    rope: RopeSection
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    lora: LoraSection = Field(default_factory=LoraSection)
    data: DataSection
    train: TrainSection = Field(default_factory=TrainSection)
    calibrate: CalibrateSection = Field(default_factory=CalibrateSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    hub: HubSection = Field(default_factory=HubSection)
    output: OutputSection = Field(default_factory=OutputSection)
    search: SearchSection | None = None
    # What the lengths given as multiples of the model's window came to (`rope.target_length: 4x ... = 256`).
    _window_lines: list[str] = PrivateAttr(default_factory=list)

    @property
    def window_lines(self) -> list[str]:
        """One line per length the recipe gave as a multiple of the model's window, and what it came to."""
        return list(self._window_lines)

    @model_validator(mode="after")
    def _cross(self) -> Recipe:
        self._resolve_mode()
        if self.search is not None:
            if self.rope.method != "longrope":
                raise ValueError(
                    f"rope.method: a search section finds longrope factors; set rope.method: longrope "
                    f"(got {self.rope.method!r})"
                )
            given = [k for k in ("short_factor", "long_factor", "factors_file") if getattr(self.rope, k) is not None]
            if given:
                raise ValueError(f"rope.{given[0]}: the search section computes the factors; remove {', '.join(given)}")
        seq = self.train.seq_len or self.rope.target_length
        if seq is None:
            raise ValueError("train.seq_len: required when rope.method is none")
        if self.rope.target_length is not None and seq > self.rope.target_length:
            raise ValueError(
                f"train.seq_len: {seq} is longer than rope.target_length ({self.rope.target_length}); "
                "train at most at the target length"
            )
        self._check_sample_lengths(seq)
        pose = self.train.pose
        if pose is not None:
            refusal = pose_refusal(self.rope.method)
            if self.rope.target_length is None:
                raise ValueError("train.pose: PoSE covers positions up to rope.target_length; set a rope method")
            if refusal:
                raise ValueError(f"train.pose: {refusal}")
            if seq >= self.rope.target_length:
                raise ValueError(
                    f"train.pose: train.seq_len ({seq}) already reaches rope.target_length; PoSE has nothing to skip. "
                    "Lower train.seq_len (e.g. to the original window or 2x it) or drop train.pose"
                )
            if pose.chunks > seq:
                raise ValueError(f"train.pose.chunks: {pose.chunks} chunks cannot split a row of {seq} tokens")
            if pose.sampling == "official" and pose.chunks != 2:
                raise ValueError(
                    f"train.pose.chunks: the official PoSE sampling uses 2 chunks, not {pose.chunks}; set "
                    "train.pose.chunks=2 or train.pose.sampling=contiguous"
                )
        refusal = sequence_parallel_refusal(self)
        if refusal:
            raise ValueError(refusal)
        return self

    def _resolve_mode(self) -> None:
        # The one place the fine-tuning mode and the base's storage are made to agree, by what the recipe does not
        # say: a recipe without train.mode and with an unquantized base is a LoRA run (as before the key existed);
        # LoRA and full fine-tuning on a base whose quantization is not given train an unquantized one. Both given
        # and at odds: refused by ctxext.recipe.refusals, naming the key.
        given_quantization = "mode" in self.quantization.model_fields_set
        if "mode" not in self.train.model_fields_set and self.quantization.mode == "none":
            self.train.mode = "lora"
        elif self.train.mode != "qlora" and not given_quantization:
            self.quantization.mode = "none"

    def _check_sample_lengths(self, seq: int) -> None:
        # A task sample is at most one row long: longer lengths used to be cut to train.seq_len without a word.
        for i, source in enumerate(self.data.mixture or []):
            for name in ("min_length", "max_length"):
                value = getattr(source, name)
                if value is not None and value > seq:
                    raise ValueError(
                        f"data.mixture.{i}.{name}: {value} is longer than train.seq_len ({seq}), and a sample is at "
                        f"most one row; lower it to {seq} or less, or raise train.seq_len"
                    )
            if source.min_length and source.max_length and source.min_length > source.max_length:
                raise ValueError(
                    f"data.mixture.{i}.min_length: {source.min_length} is above max_length ({source.max_length})"
                )

    @property
    def seq_len(self) -> int:
        """The training sequence length (``train.seq_len`` or ``rope.target_length``)."""
        return int(self.train.seq_len or self.rope.target_length)  # type: ignore[arg-type]

    @property
    def probe_length(self) -> int | None:
        """The adaptive stop's probe length (``train.probe.length``, else the target), ``None`` without a probe."""
        probe = self.train.probe
        if probe is None:
            return None
        return int(probe.length or self.rope.target_length or self.seq_len)

    def probe_forms(self) -> list[int]:
        """The key forms the adaptive stop's probe may ask in: the mixture's needle templates, else the task's.

        The needle task's training forms, when the mixture names none. The evaluation's held-out forms stay unseen
        (the probe measures what training teaches, on held-out text).
        """
        from ctxext.tasks.registry import get_task

        for source in self.data.mixture or []:
            if source.task == "needle" and source.templates:
                return list(source.templates)
        return get_task("needle").training_templates()

    def search_folder(self) -> Path | None:
        """Where the ``search:`` section's search is written: ``search.out``, by default ``<output.dir>/search``."""
        if self.search is None:
            return None
        return Path(self.search.out) if self.search.out else Path(self.output.dir) / "search"


def _parse_value(text: str) -> Any:
    # YAML scalars, so that train.max_steps=10 is an int and lora.target_modules=[q_proj] a list.
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted ``key=value`` overrides to a recipe dict.

    Args:
        data: the parsed YAML (modified and returned).
        overrides: strings such as ``train.max_steps=10``.

    Returns:
        The updated dict.

    Raises:
        RecipeError: an override that is not ``key=value``.
    """
    problems: list[tuple[str, str]] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append((item, "an override must look like section.key=value, e.g. train.max_steps=10"))
            continue
        problem = _set_dotted(data, key.strip(), _parse_value(value))
        if problem:
            problems.append((key, problem))
    if problems:
        raise RecipeError("command line", problems)
    return data


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> str | None:
    """Set ``key`` (dotted; a list item by its index, ``data.mixture.1.weight``); return the problem, if any."""
    node: Any = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            # A list item by index; one past the end appends (data.mixture.2={task: multikey, ...}).
            if not part.isdigit() or int(part) > len(node) or (int(part) == len(node) and not last):
                where, size = ".".join(parts[:depth]), len(node)
                return f"{where} is a list of {size} item(s): give an index below {size}, or {size} to add one"
            if int(part) == len(node):
                node.append(value)
                return None
            if last:
                node[int(part)] = value
                return None
            node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return None
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
        else:
            return f"{parts[depth - 1]} is not a section"
    return None


def _format_errors(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (misspelt? `ctxext validate --schema` lists every key)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            # Our validators name the field first ("target_length: ..."); fold it into the location.
            head, sep, rest = msg.partition(": ")
            if sep and head.replace(",", "").replace("_", "").replace(".", "").replace(" ", "").isalnum():
                loc = ".".join(filter(None, [loc, head])) if loc else head
                msg = rest
        problems.append((loc or "(recipe)", msg))
    return problems


def parse_recipe(data: dict[str, Any], source: str = "recipe") -> Recipe:
    """Validate a recipe dict.

    Args:
        data: the parsed YAML.
        source: the file name, for messages.

    Returns:
        The validated :class:`Recipe`.

    Raises:
        RecipeError: with every problem, each naming its key.
    """
    if not isinstance(data, dict):
        raise RecipeError(source, [("(recipe)", "a recipe must be a YAML mapping of sections")])
    window_problems, window_lines = resolve_window_multiples(Recipe, data)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        # A multiple that could not be resolved fails the int check too: its own message says why, once.
        named = {key for key, _ in window_problems}
        problems = window_problems + [p for p in _format_errors(exc) if p[0] not in named]
        raise RecipeError(source, problems) from None
    if window_problems:
        raise RecipeError(source, window_problems)
    recipe._window_lines = window_lines
    return recipe


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe file.

    Args:
        path: the YAML file.
        overrides: dotted ``key=value`` strings.

    Returns:
        The validated :class:`Recipe`.

    Raises:
        RecipeError: a missing file, bad YAML, or invalid content.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a recipe YAML file" if path.is_dir() else "does not exist"
        raise RecipeError(str(path), [("(file)", what)])
    from ctxext.recipe.yamlfile import DuplicateKeyError, read_yaml

    try:
        data = read_yaml(path) or {}
    except DuplicateKeyError as exc:
        problems = [
            (key, f"given twice (lines {a} and {b}); YAML would keep only the last one silently: remove one")
            for key, a, b in exc.duplicates
        ]
        raise RecipeError(str(path), problems) from None
    except yaml.YAMLError as exc:
        raise RecipeError(str(path), [("(yaml)", str(exc))]) from None
    if not isinstance(data, dict):
        raise RecipeError(str(path), [("(recipe)", "a recipe must be a YAML mapping of sections")])
    apply_overrides(data, overrides or [])
    return parse_recipe(data, str(path))


def run_keeping_keys() -> frozenset[str]:
    """The ``section.key`` settings that only keep a run (checkpoints, logs): ``--resume`` may change them."""
    return frozenset(marked_keys(Recipe, RUN_KEEPING))


def dump_recipe(recipe: Recipe) -> str:
    """The fully resolved recipe as YAML (defaults included), for a run folder."""
    return yaml.safe_dump(json.loads(recipe.model_dump_json()), sort_keys=False)


def schema_lines() -> list[str]:
    """Every recipe key, one line each: ``section.key: type = default  — meaning`` (``ctxext validate --schema``)."""
    lines = []
    for section_name, section_field in Recipe.model_fields.items():
        # An optional section (search: SearchSection | None) is listed by its model.
        options = [a for a in getattr(section_field.annotation, "__args__", ()) if a is not type(None)]
        section = options[0] if len(options) == 1 else section_field.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            continue
        lines.append(f"{section_name}:  {(section.__doc__ or '').strip().splitlines()[0]}")
        for key, info in section.model_fields.items():
            kind = getattr(info.annotation, "__name__", None) or str(info.annotation).replace("typing.", "")
            default = "required" if info.is_required() else f"= {info.get_default(call_default_factory=True)!r}"
            meaning = f"  — {info.description}" if info.description else ""
            lines.append(f"  {section_name}.{key}: {kind} {default}{meaning}")
            if info.annotation is MemorySection:  # a nested section: each of its keys too
                for sub, sub_info in MemorySection.model_fields.items():
                    ann = sub_info.annotation
                    sub_kind = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
                    lines.append(
                        f"    {section_name}.{key}.{sub}: {sub_kind} = {sub_info.default!r}  — {sub_info.description}"
                    )
        if section is RopeSection:
            # The method options, generated from each method's declaration (ctxext/rope/methods/).
            for key, shared in declared_options().items():
                lines.append(f"  rope.{key}: {shared.option.type_name} | None = None  — {shared.help}")
    return lines
