"""The recipe's sections (model, rope, quantization, lora, data, train, eval, hub, search, output).

Each is a pydantic model that forbids unknown keys; :class:`~ctxext.recipe.schema.Recipe` puts them together,
checks what spans sections, and loads, overrides and dumps the YAML file.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from ctxext.recipe.memory import MemorySection
from ctxext.recipe.parallel import LENGTH_DEPENDENT_METHODS
from ctxext.recipe.search import SearchOptions
from ctxext.recipe.window import window_field
from ctxext.rope.methods import METHODS, declared_options
from ctxext.rope.plan import MAX_TARGET_LENGTH

# A Hub repository id: namespace/name, each of letters, digits, '-', '_', '.'.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")

# The json_schema_extra key of a setting that decides only how a run is kept (its checkpoints, logs, tracker),
# never what it learns: a resumed run may change it (e.g. add checkpoints to a long run that saves none).
RUN_KEEPING = "run_keeping"


def keeping_field(description: str = "", **kwargs: Any) -> Any:
    """A pydantic ``Field`` for a setting that ``ctxext train --resume`` may change (see :data:`RUN_KEEPING`)."""
    text = f"{description} (may change on --resume)" if description else "may change on --resume"
    return Field(description=text, json_schema_extra={RUN_KEEPING: True}, **kwargs)


def repo_id_problem(repo_id: str | None) -> str | None:
    """What is wrong with a Hub repository id, or ``None`` when it is valid (``USER/NAME``)."""
    if not repo_id or not _REPO_ID.match(repo_id) or ".." in repo_id or repo_id.endswith((".", "-")):
        return (
            f"{repo_id!r} is not a Hub repository id; use USER/NAME (letters, digits, '-', '_', '.'), "
            "e.g. me/llama2-7b-yarn-32k"
        )
    return None


# PoSE cannot train the methods whose frequencies depend on the processed length.
POSE_REFUSED_METHODS = LENGTH_DEPENDENT_METHODS


def pose_refusal(method: str) -> str | None:
    """Why ``train.pose`` cannot be used with ``rope.method``, or ``None`` when it can."""
    if method in POSE_REFUSED_METHODS:
        return (
            f"PoSE cannot train rope.method {method!r}: its frequencies depend on the length of the sequence "
            "processed, so a short PoSE sequence would be rotated as a short sequence whatever its position ids. "
            "Use a static method (yarn, linear, ntk, llama3, theta) or drop train.pose"
        )
    return None


class Section(BaseModel):
    """A recipe section: unknown keys are errors, and assignments (overrides) are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(Section):
    """Which base model to load, and how."""

    path: str = Field(description="local folder, Hub id, or a built-in name such as 'builtin:tiny-llama'")
    revision: str | None = None
    trust_remote_code: bool = False
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = "auto"
    original_length: int | None = Field(
        default=None, gt=0, description="pretraining context, when the config cannot tell it"
    )


class RopeSection(Section):
    """The context-extension method; options only where the method takes them.

    The option keys are not written here: each method declares its options once (``ctxext/rope/methods/``),
    and this section accepts, converts and checks exactly those of ``method``. ``rope.<option>`` reads an
    option (``None`` when not set).
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    method: str = Field(description="one of: none, " + ", ".join(METHODS))
    target_length: int | None = window_field("tokens after extension", default=None, gt=0, le=MAX_TARGET_LENGTH)
    relative_to: Literal["original", "current"] | None = Field(
        default=None,
        description="for an already-extended model: replace its extension (original) or stack on it (current)",
    )

    def options(self) -> dict[str, Any]:
        """The method options that are set."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items() if v is not None}

    def __getattr__(self, name: str) -> Any:
        # A declared option that is not set reads as None, as a typed field would.
        try:
            return super().__getattr__(name)  # type: ignore[misc]
        except AttributeError:
            if name in declared_options():
                return None
            raise

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: Any, handler: Any) -> RopeSection:
        if not isinstance(data, dict):
            # An assignment (validate_assignment hands over the section itself): fields are checked by
            # pydantic; an option assigned in code (the search sets its factors) is taken as given.
            return handler(data)
        problems, options = _option_problems(data)
        fixed = {k: v for k, v in data.items() if k in cls.model_fields}
        try:
            section = handler(fixed)
        except ValidationError as exc:
            problems = [_as_init_error(e) for e in exc.errors()] + problems
            raise ValidationError.from_exception_data(cls.__name__, problems) from None
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, problems)
        if section.method != "none" and section.target_length is None:
            raise ValueError("target_length: required when a rope method is set")
        extra = section.__pydantic_extra__
        if extra is not None:
            extra.clear()
            extra.update(options)  # converted by their declarations
        return section


def _value_error(loc: tuple[str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(type="value_error", loc=loc, input=value, ctx={"error": ValueError(message)})


def _as_init_error(error: Any) -> InitErrorDetails:
    details = InitErrorDetails(type=error["type"], loc=error["loc"], input=error.get("input"))
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details


def _option_problems(data: dict[str, Any]) -> tuple[list[InitErrorDetails], dict[str, Any]]:
    """Check a rope section's option keys against the declarations: unknown keys, other methods' options, bad values.

    Returns:
        The problems (pydantic error details) and the converted option values.
    """
    method = data.get("method")
    given = {k: v for k, v in data.items() if k not in RopeSection.model_fields}
    known = declared_options()
    problems: list[InitErrorDetails] = []
    if method != "none" and isinstance(method, str) and method not in METHODS:
        problems.append(
            _value_error(("method",), f"unknown method {method!r}; choose one of: none, {', '.join(METHODS)}", method)
        )
    spec = METHODS.get(method) if isinstance(method, str) else None
    allowed = spec.option_names if spec else frozenset()
    values: dict[str, Any] = {}
    for key, value in given.items():
        if key not in known:
            problems.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
        elif spec is None and method != "none":
            continue  # the unknown method is the problem
        elif key not in allowed:
            if value is not None:
                problems.append(
                    _value_error(
                        (key,),
                        f"not an option of method {method!r} (its options: {', '.join(sorted(allowed)) or 'none'})",
                        value,
                    )
                )
        elif value is not None:
            option = next(o for o in spec.options if o.name == key)  # type: ignore[union-attr]
            try:
                values[key] = option.parse(value)
            except ValueError as exc:
                problems.append(_value_error((key,), str(exc), value))
    return problems, values


class QuantizationSection(Section):
    """How the frozen base weights are stored during training."""

    mode: Literal["nf4", "int8", "none"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on GPU, float32 on CPU"
    )


# Names in the lora section that stand for a model's own module names, resolved against the model
# (ctxext.recipe.refusals.resolve_lora_names), so that one recipe fits Llama, Mistral, Qwen2 and GPT-NeoX alike.
ALL_LINEAR = "all-linear"
INPUT_EMBEDDINGS = "embeddings"


class LoraSection(Section):
    """LoRA adapters and the modules trained in full beside them."""

    r: int = Field(default=16, gt=0)
    alpha: float = Field(default=32, gt=0)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: [ALL_LINEAR],
        description=f"module names that get adapters; {ALL_LINEAR}: every linear layer but the output head (Llama's "
        "q/k/v/o and gate/up/down projections, GPT-NeoX's query_key_value, dense, dense_h_to_4h, dense_4h_to_h)",
    )
    extra_trainable: list[str] = Field(
        default_factory=lambda: [INPUT_EMBEDDINGS, "norm"],
        description=f"module name suffixes trained in full (LongLoRA: embeddings and norms); {INPUT_EMBEDDINGS}: "
        "the model's input embedding, whatever its name (embed_tokens, embed_in, wte)",
    )

    @model_validator(mode="after")
    def _check(self) -> LoraSection:
        if not self.target_modules:
            raise ValueError(
                "target_modules: must name at least one module (e.g. [q_proj, k_proj, v_proj, o_proj]); an empty "
                "list would put no LoRA adapter anywhere"
            )
        return self


class MixtureSource(Section):
    """One source of a training mixture: a real corpus (``path``) or a synthetic task (``task``).

    A corpus is anything the data reader reads (a local json/jsonl/parquet/txt file or folder, a Hub
    data set, ``builtin:stdlib``); a task is a name in the ``ctxext.tasks`` registry, generated in
    samples of ``min_length``–``max_length`` tokens whose needle distances follow ``data.task_distance``, on
    the training documents of ``haystack``.
    """

    weight: float = Field(allow_inf_nan=False, description="share of the training rows (normalised over all sources)")
    path: str | None = Field(default=None, description="a corpus, read like data.path")
    text_field: str = "text"
    max_documents: int | None = Field(default=None, gt=0)
    long_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="corpus: share of this source's rows taken from documents at least train.seq_len long "
        "(length up-sampling, Fu et al. 2024); null keeps the natural share",
    )
    task: str | None = Field(default=None, description="a synthetic task name (ctxext.tasks registry)")
    templates: list[int] | None = Field(
        default=None,
        description="task: template indices used for training (null: the task's training templates, i.e. all but "
        "those it holds out for evaluation)",
    )
    distractors: int | None = Field(default=None, ge=0, description="task: distractor keys (tasks that take them)")
    min_length: int | None = window_field(
        "task: shortest sample (null: seq_len); without PoSE a sample is as long as its needle distance needs, at "
        "least this",
        default=None,
        gt=0,
    )
    max_length: int | None = window_field(
        "task: longest sample (null: train.seq_len; without PoSE also the distance span); the last sample of a row "
        "takes what the others cannot",
        default=None,
        gt=0,
    )
    answer_only: bool = Field(default=False, description="task: loss only on the answer tokens (default: all tokens)")
    haystack: str | None = Field(
        default=None, description="task: the haystack corpus (default: the first corpus source, else data.path)"
    )

    @model_validator(mode="after")
    def _check(self) -> MixtureSource:
        if (self.path is None) == (self.task is None):
            raise ValueError("path: give exactly one of path (a corpus) or task (a synthetic task)")
        if self.weight < 0:
            raise ValueError(f"weight: {self.weight} is negative; weights are shares, use a value >= 0")
        if self.templates is not None and not self.templates:
            raise ValueError("templates: empty; list template indices, or drop the key to train on all the task's")
        if self.task is not None:
            from ctxext.tasks import task_names

            if self.task not in task_names():
                raise ValueError(f"task: unknown task {self.task!r}; choose one of: {', '.join(task_names())}")
            stray = [k for k in ("max_documents", "long_fraction") if getattr(self, k) is not None]
            if self.min_length is not None and self.max_length is not None and self.max_length < self.min_length:
                raise ValueError(f"max_length: {self.max_length} is below min_length {self.min_length}")
        else:
            keys = ("templates", "distractors", "haystack", "min_length", "max_length")
            stray = [k for k in keys if getattr(self, k) is not None]
            stray += ["answer_only"] if self.answer_only else []
        if stray:
            kind = "a task" if self.task is not None else "a corpus"
            raise ValueError(f"{stray[0]}: not an option of {kind} source")
        return self


class DataSection(Section):
    """Long documents to train on: one corpus (``path``) or a weighted ``mixture`` of corpora and tasks."""

    path: str | None = Field(
        default=None,
        description="local jsonl/json/parquet/csv or text (txt, md, py, …) file or folder, a Hub data set, "
        "or 'builtin:stdlib'",
    )
    text_field: str = "text"
    split: str = "train"
    name: str | None = Field(default=None, description="Hub data set configuration name")
    packing: bool = True
    document_mask: bool = Field(
        default=False, description="packing: no attention across packed documents (positions restart per document)"
    )
    min_tokens: int | None = Field(default=None, gt=0, description="without packing: keep documents this long")
    validation_fraction: float = Field(default=0.05, ge=0, lt=1)
    max_documents: int | None = Field(default=None, gt=0)
    num_proc: int = Field(default=2, gt=0)
    mixture: list[MixtureSource] | None = Field(
        default=None, description="weighted corpora and synthetic tasks (replaces path); see README"
    )
    short_fraction: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="share of rows made of blocks at the model's original length (unscaled positions; ProLong ~0.4)",
    )
    task_distance: str = Field(
        default="uniform",
        description="task rows: how needle-to-question distances (in positions, PoSE included) are drawn over the "
        "span (rope.target_length with PoSE, else the longest sample): uniform, or far (density rising with the "
        "distance; the last quarter holds 44 %)",
    )
    task_position: str = Field(
        default="packed",
        description="task rows: where a needle sits, given its distance: packed (as early as packing leaves it: "
        "near needles only in short samples) or uniform (drawn uniformly over what the span leaves, so a near "
        "needle also comes after a long prefix, as at depth 100 of an evaluation at the target; measured no "
        "better, see docs/training.md)",
    )

    @model_validator(mode="after")
    def _check(self) -> DataSection:
        from ctxext.tasks.distance import DISTRIBUTIONS, POSITIONS

        if self.task_distance not in DISTRIBUTIONS:
            raise ValueError(
                f"task_distance: unknown distribution {self.task_distance!r}; choose one of: {', '.join(DISTRIBUTIONS)}"
            )
        if self.task_position not in POSITIONS:
            raise ValueError(
                f"task_position: unknown placement {self.task_position!r}; choose one of: {', '.join(POSITIONS)}"
            )
        if self.mixture is None:
            if self.path is None:
                raise ValueError("path: required (or give data.mixture)")
            return self
        if not self.mixture:
            raise ValueError("mixture: empty; list at least one source, or drop it and set data.path")
        if sum(s.weight for s in self.mixture) <= 0:
            raise ValueError("mixture: the weights sum to 0; give at least one source a positive weight")
        corpora = any(s.path for s in self.mixture)
        if not corpora and self.path is None:
            raise ValueError("mixture: tasks need a haystack; add a corpus source or set data.path")
        if self.path is not None and (corpora or all(s.haystack for s in self.mixture if s.task)):
            # Beside a mixture, data.path is only the default haystack of task sources: here it would be unused.
            raise ValueError(
                f"path: {self.path!r} would be ignored: with data.mixture the training text comes from the mixture's "
                "sources (data.path is only the haystack of task sources when the mixture has no corpus). Move it "
                f"into data.mixture as a source ({{path: {self.path}, weight: ...}}) or remove data.path"
            )
        if self.short_fraction > 0 and not any(s.path and s.weight > 0 for s in self.mixture):
            raise ValueError("short_fraction: short blocks are cut from corpus sources; add one with a positive weight")
        return self


class PoseSection(Section):
    """PoSE (Zhu et al. 2024): position ids that skip, so short rows cover distances up to the target."""

    chunks: int = Field(default=2, ge=2, description="contiguous pieces per row (the paper uses 2)")
    sampling: Literal["official", "contiguous"] = Field(
        default="official",
        description="official: as the authors' code (2 chunks, the first at most half the row, the second's text "
        "read further on in the document); contiguous: chunk cuts uniform, text unchanged",
    )


# How the weights are trained: LoRA adapters on a 4-/8-bit base, adapters on a bf16 base, or every weight.
FinetuneMode = Literal["qlora", "lora", "full"]
FINETUNE_MODES: tuple[str, ...] = get_args(FinetuneMode)


# Tokens per forward pass of the probe: shorter key sets are batched up to it, a longer one runs alone, so the probe's
# activations stay within one probe-length sequence's (the training step's memory holds them; ctxext plan counts it).
PROBE_BATCH_TOKENS = 2048


class ProbeSection(Section):
    """Adaptive stop: a retrieval probe at the target length every ``interval`` steps (docs/training.md)."""

    length: int | None = window_field("probe tokens (default: rope.target_length)", default=None, gt=0)
    trials: int = Field(
        default=64, ge=0, description="key retrievals per probe (at least one; several per input, one pass each)"
    )
    keys: int = Field(
        default=1,
        gt=0,
        description="keys hidden in each probe input (one forward scores them all; more than one is a multi-key "
        "lookup, which a base that retrieves one needle may not do: raise it only for a model that does)",
    )
    interval: int = Field(default=100, gt=0, description="optimizer steps between probes (at most train.max_steps)")
    goal: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="stop once this share of the probe's keys is retrieved (at every depth with depths set)",
    )
    patience: int | None = Field(
        default=4, gt=0, description="stop after this many probes without a better score (null: never on a plateau)"
    )
    rule: Literal["worst", "pooled"] = Field(
        default="worst",
        description="with depths: worst: the worst depth meets the goal (the target is every depth's); pooled: all "
        "keys together meet it and no depth is more than train.probe.margin below it (replayed on the transfer "
        "runs it stops 38 % sooner; its adapters are not yet evaluated)",
    )
    margin: float = Field(default=0.05, ge=0, le=1, description="pooled: how far below the goal a depth may read")
    depths: int | None = Field(
        default=5,
        ge=2,
        description="the probe's keys stand at this many depths, evenly from 0 to 100 % (5: the evaluation's 0, 25, "
        "50, 75 and 100 %), and the goal is every depth's (the run's worst depth decides); null: spread over the "
        "inputs, the goal on all keys together",
    )
    forms: Literal["window", "trained"] = Field(
        default="window",
        description="window: ask only in the training key forms the base retrieves inside its own window (checked "
        "before training, as ctxext search checks them; the skill a longer window must keep); trained: in every "
        "training form, also those the fine-tune has to teach from nothing",
    )


class TrainSection(Section):
    """The optimisation loop."""

    mode: FinetuneMode = Field(
        default="qlora",
        description="qlora: LoRA adapters on a 4-/8-bit base (quantization.mode); lora: adapters on a bf16 base; "
        "full: every weight (fp32 master copies and AdamW states, bf16 compute on GPU; FSDP2 or ZeRO-3 across "
        "GPUs), saved as a complete model. Not given: lora when quantization.mode is none",
    )
    seq_len: int | None = window_field("training row tokens (default: rope.target_length)", default=None, gt=0)
    micro_batch_size: int = Field(default=1, gt=0)
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    max_steps: int = Field(default=100, gt=0)
    learning_rate: float = Field(default=2e-4, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    optimizer: Literal["auto", "adamw", "paged_adamw_8bit"] = "auto"
    seed: int = 42
    gradient_checkpointing: Literal["auto"] | bool = Field(
        default=True,
        description="recompute activations in the backward pass (auto: only where `ctxext train`'s plan of the "
        "step on its machine does not fit without it, decided once when the run starts; docs/planning.md)",
    )
    loss_chunk_size: int = Field(default=1024, gt=0, description="tokens per chunk of the chunked cross-entropy")
    log_every: int = keeping_field("steps between metrics lines", default=1, gt=0)
    eval_every: int | None = Field(default=None, gt=0)
    eval_batches: int = Field(default=4, gt=0)
    save_every: int | None = keeping_field(
        "steps between checkpoints (none: at the end and on a stop signal)", default=None, gt=0
    )
    keep_checkpoints: int = keeping_field("how many of the latest checkpoints to keep", default=2, gt=0)
    tracker: Literal["none", "tensorboard", "wandb"] = keeping_field("where metrics are also logged", default="none")
    context_parallel_size: int = Field(
        default=1,
        gt=0,
        description="split each sequence over N GPUs with torch's ring attention (CUDA, SDPA); around "
        "train.sequence_parallel_size when both are set (docs/sequence-parallel.md)",
    )
    sequence_parallel_size: int = Field(
        default=1,
        gt=0,
        description="split each sequence over N processes (Ulysses: DeepSpeed's attention, or ctxext's where "
        "DeepSpeed cannot split the heads; N at most the attention heads; docs/sequence-parallel.md)",
    )
    pose: PoseSection | None = Field(
        default=None, description="PoSE: train positions up to rope.target_length with train.seq_len-token rows"
    )
    memory: MemorySection = Field(default_factory=MemorySection, description="memory levers (docs/planning.md)")
    probe: ProbeSection | None = Field(
        default=None,
        description="adaptive stop: probe retrieval at the target length, keep the best adapter, stop at the goal "
        "or a plateau (train.max_steps is the ceiling)",
    )

    @property
    def checkpointing(self) -> bool:
        """Whether the run recomputes activations.

        ``auto`` that no plan has decided (a library caller of :func:`ctxext.training.run.train`) is off, as on
        every machine where the step fits.
        """
        return self.gradient_checkpointing is True


class EvalSection(Section):
    """Evaluation run at the end of training."""

    suite: str | None = Field(default=None, description="path to an eval suite YAML (eval/*.yaml)")
    compare_base: bool = False


class HubSection(Section):
    """Publishing to the Hugging Face Hub."""

    repo_id: str | None = None
    private: bool = True
    push: bool = False
    revision: str | None = None
    merged: bool = Field(
        default=False,
        description="push the merged model (ctxext merge, smoke-tested) instead of the adapter",
    )

    @model_validator(mode="after")
    def _check(self) -> HubSection:
        if self.push and not self.repo_id:
            raise ValueError("repo_id: required when hub.push is true")
        if self.repo_id is not None and repo_id_problem(self.repo_id):
            raise ValueError(f"repo_id: {repo_id_problem(self.repo_id)}")
        return self


class SearchSection(SearchOptions):
    """A RoPE factor search (``ctxext search``) run before training; needs ``rope.method: longrope``."""

    out: str | None = Field(
        default=None, description="the search's model folder (default: <output.dir>/search, inside the run)"
    )


class OutputSection(Section):
    """Where the run is written."""

    dir: str = "runs/ctxext"
