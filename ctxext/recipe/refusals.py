"""What ``ctxext train`` refuses before a model loads, decided in one place for ``ctxext validate`` and ``train``.

A recipe that validates must not be refused by ``train`` for a reason knowable from the recipe, the model's config
and this machine. Every such check is here; ``ctxext validate`` prints what :func:`refusals` finds, and ``train``
(the command and the library function) raises it through :func:`check_refusals` before it launches, locks or loads
anything. Each problem is a ``(key, message)`` pair: the recipe key at fault and the way out. Importing this module
does not import torch; the checks that need the model's structure import it when they run.

Checked here:

* **this machine** (:class:`Machine`): a tracker that is not installed; settings that need CUDA (the paged 8-bit
  optimizer, flash attention, offloaded checkpoints, the ring of ``train.context_parallel_size``); a bf16 residual
  stream without a bf16 run, or an fp32 one that would upcast;
* **the recipe**: settings that exclude each other (``train.mode`` against ``quantization.mode``: a full fine-tune
  or LoRA on a quantized base, QLoRA on an unquantized one; LoRA settings in a full fine-tune; the ring with PoSE,
  document masks or short blocks; short blocks without a RoPE method; unpacked examples shorter than a row); a
  ``train.probe`` longer than the model is extended to, with no trials, an interval past the step ceiling, or no
  held-out documents to draw from;
* **the data sources**: a local corpus that does not exist or is not UTF-8, a built-in read in a field it lacks;
* **the model's config**, read without weights (local folders and built-ins; a Hub model is not fetched, and these
  checks then wait for training): the model exists and its weight files are readable; its RoPE can be extended as
  the recipe asks (the plan; a search needs an unextended base); its heads can be split over
  ``train.sequence_parallel_size`` (:func:`ctxext.recipe.parallel.ulysses_plan`, the one rule for the head split,
  and DeepSpeed installed where its attention serves the shape) and its attention run as a ring
  (:func:`ctxext.recipe.parallel.ring_refusal`); LoRA target and trained modules must exist and the tiled MLP must
  be a gated one, both checked on a weightless copy built on the meta device.

Checked elsewhere, because they need more than the recipe, the config and the machine:

* the launch: the processes of one sequence must divide the processes started
  (:func:`ctxext.recipe.parallel.check_split_launch`, by ``ctxext train`` from the launcher's ``WORLD_SIZE`` and
  again from accelerate; ``validate`` warns); a launcher whose processes accelerate does not see as one job,
  an FSDP or DeepSpeed launch on the CPU (accelerate shards on GPUs only), gradient accumulation under a DeepSpeed
  config, and a ``--resume`` on another number of processes (``ctxext.training.launch``);
* the workflows' own inputs, checked by the CLI (``ctxext.cli.validate``) for both commands: the output folder
  (``ctxext.training.folder.check_output_dir``; the library's ``train`` checks it itself), the eval suite, the search
  settings, the mixture's needle distances;
* the data once read (too few documents or blocks, a task that cannot fit its length: ``ctxext.training.data``);
* the loaded model and its files: a tokenizer without an EOS token (``ctxext.training.model.load_base``), the
  runtime RoPE check after the patch, out of memory (or, with ``train --strict``, a plan that does not fit), and on
  ``--resume`` the base weights' fingerprint.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxext.errors import InputError
from ctxext.recipe.hardware import attention_problem, compute_dtype_name, resolve_attention
from ctxext.recipe.memory import Levers, recipe_levers

if TYPE_CHECKING:
    from ctxext.recipe.schema import Recipe

Problem = tuple[str, str]

# Optional packages a recipe setting needs: module → what installs it.
OPTIONAL = {
    "tensorboard": "pip install tensorboard",
    "wandb": "pip install wandb",
    "flash_attn": "pip install flash-attn",
    "deepspeed": "pip install 'ctxext[deepspeed]'",
}


@dataclass(frozen=True)
class Machine:
    """What a recipe's settings depend on in the machine that trains it.

    Attributes:
        cuda: a CUDA device is available (training then runs on it).
        packages: the optional packages (:data:`OPTIONAL`) installed.
    """

    cuda: bool
    packages: frozenset[str] = frozenset()

    @classmethod
    def this(cls) -> Machine:
        """This machine (imports torch to ask for CUDA)."""
        import torch

        installed = frozenset(name for name in OPTIONAL if importlib.util.find_spec(name) is not None)
        return cls(cuda=torch.cuda.is_available(), packages=installed)

    def has(self, package: str) -> bool:
        """Whether an optional package is installed."""
        return package in self.packages


@dataclass
class Checked:
    """What the checks found: problems ``train`` refuses, and warnings about settings that run but teach little.

    Attributes:
        problems: ``(key, message)`` for each refusal.
        warnings: settings that run but are probably not what the user wants.
    """

    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def refusals(recipe: Recipe, machine: Machine | None = None) -> Checked:
    """Everything ``ctxext train`` would refuse the recipe for before it loads a model.

    Args:
        recipe: a validated recipe.
        machine: where it trains (default: this machine).

    Returns:
        The problems (each naming its key) and warnings.
    """
    machine = machine or Machine.this()
    checked = Checked()
    levers = _machine_problems(recipe, machine, checked.problems)
    checked.problems += _recipe_problems(recipe)
    checked.problems += probe_problems(recipe)
    checked.problems += _data_problems(recipe)
    _model_problems(recipe, machine, levers, checked)
    return checked


def check_refusals(recipe: Recipe, source: str = "recipe", machine: Machine | None = None) -> list[str]:
    """Raise every :func:`refusals` problem at once (``train``'s start); return the warnings.

    Raises:
        RecipeError: naming each key at fault.
    """
    from ctxext.recipe.schema import RecipeError

    checked = refusals(recipe, machine)
    if checked.problems:
        raise RecipeError(source, checked.problems)
    return checked.warnings


def _problem(exc: InputError) -> Problem:
    """An ``InputError`` whose message starts with ``key: `` as a ``(key, message)`` pair."""
    key, _, message = str(exc).partition(": ")
    return key, message


def _machine_problems(recipe: Recipe, machine: Machine, problems: list[Problem]) -> Levers | None:
    """Settings this machine cannot run; returns the memory levers it would use (``None`` when refused)."""
    cfg, cuda = recipe.train, machine.cuda
    if cfg.tracker != "none" and not machine.has(cfg.tracker):
        problems.append(("train.tracker", f"{cfg.tracker} is not installed; {OPTIONAL[cfg.tracker]}"))
    if cfg.optimizer == "paged_adamw_8bit" and not cuda:
        problems.append(("train.optimizer", "paged_adamw_8bit pages optimizer state through CUDA; use adamw on CPU"))
    attention = attention_problem(recipe.model.attn_implementation, cuda, machine.has("flash_attn"))
    if attention:
        problems.append(("model.attn_implementation", attention))
    dtype = compute_dtype_name(recipe.quantization.compute_dtype, cuda)
    try:
        return recipe_levers(recipe, "cuda" if cuda else "cpu", dtype)
    except InputError as exc:
        problems.append(_problem(exc))
        return None


def _mode_problems(recipe: Recipe) -> list[Problem]:
    """``train.mode`` against the base's storage and the LoRA settings (the schema resolved what was not given)."""
    mode, quantization = recipe.train.mode, recipe.quantization.mode
    problems = []
    if mode == "full" and quantization != "none":
        problems.append(
            (
                "quantization.mode",
                f"{quantization}: a full fine-tune trains every weight, and 4-/8-bit weights cannot be trained; set "
                "quantization.mode=none (bf16 weights, fp32 master copies), or train.mode=qlora for adapters on a "
                "quantized base",
            )
        )
    elif mode == "lora" and quantization != "none":
        problems.append(
            (
                "quantization.mode",
                f"{quantization}: train.mode lora trains adapters on an unquantized base; set quantization.mode=none, "
                "or train.mode=qlora for adapters on a quantized base",
            )
        )
    elif mode == "qlora" and quantization == "none":
        problems.append(
            (
                "quantization.mode",
                "none: train.mode qlora trains adapters on a quantized base; set quantization.mode=nf4 (or int8), "
                "or train.mode=lora for adapters on a bf16 base",
            )
        )
    if mode == "full" and recipe.lora.model_fields_set:
        # The lora section configures adapters; a full fine-tune has none, so its settings would be ignored.
        problems.append(
            (
                "lora",
                f"{', '.join(sorted(recipe.lora.model_fields_set))}: LoRA settings mean nothing in a full fine-tune "
                "(every weight is trained, no adapter is made); remove the lora section, or set train.mode=lora",
            )
        )
    return problems


def _recipe_problems(recipe: Recipe) -> list[Problem]:
    """Settings that exclude each other, found by the data preparation or the loop once the model is loaded."""
    data, cfg = recipe.data, recipe.train
    problems = _mode_problems(recipe)
    if cfg.context_parallel_size > 1 and (cfg.pose or data.document_mask or data.short_fraction):
        problems.append(("train.context_parallel_size", "PoSE, data.document_mask and data.short_fraction need 1"))
    if data.short_fraction > 0 and recipe.rope.method == "none":
        problems.append(("data.short_fraction", "needs the model's original length; set a rope method"))
    if not data.packing and data.min_tokens is not None and data.min_tokens < recipe.seq_len:
        problems.append(
            (
                "data.min_tokens",
                f"{data.min_tokens} is below train.seq_len ({recipe.seq_len}); without packing every example must "
                "fill a whole block (set data.min_tokens >= train.seq_len or turn packing on)",
            )
        )
    return problems


def probe_problems(recipe: Recipe) -> list[Problem]:
    """``train.probe`` settings that cannot measure anything: too long, no trials, never reached, nothing held out."""
    probe, cfg = recipe.train.probe, recipe.train
    if probe is None:
        return []
    problems = []
    ceiling = recipe.rope.target_length or recipe.seq_len
    if probe.length is not None and probe.length > ceiling:
        what = "rope.target_length" if recipe.rope.target_length else "train.seq_len (rope.method is none)"
        problems.append(
            (
                "train.probe.length",
                f"{probe.length} is longer than the model is extended to ({what}: {ceiling}); probe at most there "
                "(default: rope.target_length)",
            )
        )
    if probe.trials == 0:
        problems.append(("train.probe.trials", "0 trials measure nothing; set at least 1 (or train.probe: null)"))
    elif probe.depths is not None and probe.trials < probe.depths:
        problems.append(
            (
                "train.probe.trials",
                f"{probe.trials} keys leave some of train.probe.depths' {probe.depths} depths without one, and the "
                f"worst depth decides; set at least {probe.depths} (32 per depth tell 90 % from 97 %), or "
                "train.probe.depths: null",
            )
        )
    if probe.interval > cfg.max_steps:
        problems.append(
            (
                "train.probe.interval",
                f"{probe.interval} is larger than train.max_steps ({cfg.max_steps}), the step ceiling: the probe "
                f"would never run; set it to {cfg.max_steps} or less",
            )
        )
    if recipe.data.validation_fraction == 0:
        problems.append(
            (
                "data.validation_fraction",
                "train.probe draws its documents from the held-out validation split (never the evaluation's data); "
                "set data.validation_fraction above 0 (e.g. 0.05)",
            )
        )
    return problems + _probe_heldout_problems(recipe)


def _probe_heldout_problems(recipe: Recipe) -> list[Problem]:
    """Training corpora that read the evaluation's held-out files: the probe would stop on the evaluation's data."""
    from ctxext.scoring.texts import refuse_heldout

    data = recipe.data
    corpora = [("data.path", data.path)] + [
        (f"data.mixture[{i}].path", s.path) for i, s in enumerate(data.mixture or []) if s.path
    ]
    problems = []
    for key, path in corpora:
        # In training plain builtin:stdlib is the training split (the held-out files are evaluation's alone).
        if path is None or path in ("builtin:stdlib", "builtin:stdlib-train"):
            continue
        try:
            refuse_heldout(path, key, "train.probe's stop", "train on builtin:stdlib (its training split) instead")
        except InputError as exc:
            problems.append(_problem(exc))
    return problems


def _data_problems(recipe: Recipe) -> list[Problem]:
    """``data.path`` and each corpus of a mixture: a local source that exists and reads as UTF-8, a built-in's field."""
    from ctxext.models.data_sources import is_stdlib, stdlib_problem

    data = recipe.data
    sources = [("data", data.path, data.text_field)] + [
        (f"data.mixture[{i}]", s.path, s.text_field) for i, s in enumerate(data.mixture or []) if s.path
    ]
    problems = []
    for key, path, text_field in sources:
        if path is None:
            continue
        if is_stdlib(path):
            problem = stdlib_problem(path, text_field)
            if problem:
                problems.append((f"{key}.{problem[0]}", problem[1]))
        elif not path.startswith("builtin:"):
            problems += _corpus_problems(f"{key}.path", path)
    return problems


def _corpus_problems(key: str, path: str) -> list[Problem]:
    from ctxext.models.data_sources import looks_like_path
    from ctxext.models.sources import SourceError, check_utf8

    local = Path(path).expanduser()
    if not local.exists():
        if looks_like_path(path):
            return [(key, f"{path} does not exist (not a file, a folder, builtin:stdlib or a Hub id)")]
        return []  # a Hub data set: not fetched here
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    try:
        check_utf8([f for f in files if not f.name.startswith(".")], key)
    except SourceError as exc:
        return [(key, str(exc).removeprefix(f"{key}: "))]
    return []


def _model_problems(recipe: Recipe, machine: Machine, levers: Levers | None, checked: Checked) -> None:
    """The model's config against the recipe: the RoPE plan, the split, LoRA modules and the tiled MLP."""
    config = _local_config(recipe, checked.problems)
    checked.problems += split_problems(recipe, config, machine)
    if config is None:
        return
    _plan_problems(recipe, config, checked)
    checked.problems += _structure_problems(recipe, config, levers)


def split_problems(recipe: Recipe, config: Any, machine: Machine) -> list[Problem]:
    """A head split no engine serves here, or a ring this machine or model cannot run (``train``'s own rules).

    Args:
        recipe: the recipe.
        config: the model's config (``None``: a Hub model, not read; the heads and the window are checked when
            training loads it).
        machine: where it trains.
    """
    from ctxext.recipe.parallel import RING_KEY, SPLIT_KEY, head_split_problem, ring_refusal

    cfg, problems = recipe.train, []
    if cfg.sequence_parallel_size > 1 and config is not None:
        heads = head_split_problem(config, cfg.sequence_parallel_size, machine.has("deepspeed"))
        if heads:
            problems.append((SPLIT_KEY, heads))
    if cfg.context_parallel_size > 1:
        attention = resolve_attention(recipe.model.attn_implementation, machine.cuda, machine.has("flash_attn"))
        ring = ring_refusal(config, attention, machine.cuda)
        if ring:
            problems.append((RING_KEY, f"{cfg.context_parallel_size}: {ring}"))
    return problems


def _local_config(recipe: Recipe, problems: list[Problem]) -> Any:
    """The model's config, read without weights from a local folder or a built-in (``None``: a Hub id, or a problem).

    Its weight files are checked readable too: a truncated download is named before hours of setup.
    """
    from ctxext.models.builtin import BUILTIN_PREFIX
    from ctxext.models.gguf import split_gguf_ref
    from ctxext.models.sources import load_config
    from ctxext.models.weights import check_weights_readable

    path = recipe.model.path
    try:
        gguf = split_gguf_ref(path) is not None  # a GGUF file: checked and converted (once) by load_config below
    except InputError as exc:
        problems.append(("model.path", str(exc)))
        return None
    if not path.startswith(BUILTIN_PREFIX) and not Path(path).expanduser().exists() and not gguf:
        if path.startswith((".", "/", "~")) or path.count("/") != 1:
            problems.append(("model.path", f"{path} does not exist (not a folder, builtin:NAME or a Hub id org/name)"))
        return None  # a Hub id: not fetched here
    try:
        config, folder = load_config(path, recipe.model.revision)
        if folder.is_dir():
            check_weights_readable(folder)
    except InputError as exc:  # SourceError and weight problems alike
        problems.append(("model.path", str(exc)))
        return None
    return config


def _plan_problems(recipe: Recipe, config: Any, checked: Checked) -> None:
    """The RoPE plan the recipe asks for (or, for a search, a base it can search), and what it teaches."""
    from ctxext.rope.plan import describe_extension, plan_extension
    from ctxext.rope.read import read_rope
    from ctxext.rope.types import RopeError

    rope, seq_len = recipe.rope, recipe.seq_len
    try:
        state = read_rope(config, original_length=recipe.model.original_length)
    except InputError as exc:  # a config whose RoPE cannot be read: the model is at fault, not the recipe
        checked.problems.append(("model.path", str(exc)))
        return
    if rope.method == "none":
        if seq_len > state.current_length:
            checked.warnings.append(
                f"rope.method is none but train.seq_len {seq_len} is beyond the model's context "
                f"{state.current_length}: positions past it run with unscaled RoPE (extrapolation), which models "
                "learn poorly; choose a method (yarn, linear …) with rope.target_length"
            )
        return
    target = int(rope.target_length or 0)
    try:
        if recipe.search is not None:
            existing = describe_extension(state)
            if existing:
                checked.problems.append(
                    (
                        "model.path",
                        f"this model is {existing}; the search finds long factors for an unscaled base model: search "
                        "the model it was extended from",
                    )
                )
                return
            # The factors come from the search: the plan checked here is a linear one of the same lengths.
            plan = plan_extension(config, "linear", target, None, recipe.model.original_length)
        else:
            plan = plan_extension(
                config, rope.method, target, rope.options(), recipe.model.original_length, rope.relative_to
            )
    except RopeError as exc:
        checked.problems.append(("rope", str(exc)))
        return
    # What composing with an existing extension changes (rope.relative_to), said before training.
    checked.warnings.extend(note for note in plan.notes if note.startswith("the model was"))
    # PoSE trains short windows whose position ids reach the target on purpose.
    if seq_len <= plan.original_length and recipe.train.pose is None:
        checked.warnings.append(
            f"train.seq_len {seq_len} is at or below the model's original context {plan.original_length}: the "
            f"fine-tune never sees a position beyond the original window, so it cannot teach the {plan.method} "
            f"extension to {plan.target_length}; raise train.seq_len (default: rope.target_length)"
        )


# Module names of architectures that do not use the Llama names: model_type -> (target_modules, extra_trainable),
# proposed when a recipe's Llama names match nothing (the defaults, all-linear and embeddings, fit every one).
LORA_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpt_neox": (("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"), ("embed_in", "norm")),
}


def _structure_problems(recipe: Recipe, config: Any, levers: Levers | None) -> list[Problem]:
    """LoRA modules and the tiled MLP, checked on the model built from its config on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=recipe.model.trust_remote_code)
    except Exception:  # an architecture transformers cannot build from the config alone: training finds out
        return []
    problems = lora_module_problems(model, recipe.lora) if recipe.train.mode != "full" else []
    if levers is not None and levers.tiled_mlp is not None:
        tiled = tiled_mlp_problem(model)
        if tiled:
            problems.append(("train.memory.tiled_mlp", tiled))
    return problems


def _linear_leaves(model: Any) -> set[str]:
    # The last part of every linear layer's path (quantized linear layers are ``torch.nn.Linear`` too).
    import torch

    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _leaf_of(model: Any, module: Any) -> str | None:
    # The last part of the path of ``module`` inside ``model`` (``None``: not one of its modules).
    return next((name.rsplit(".", 1)[-1] for name, m in model.named_modules() if name and m is module), None)


def resolve_lora_names(model: Any, targets: list[str], extras: list[str]) -> tuple[list[str], list[str]]:
    """The ``lora`` section's module names with ``all-linear`` and ``embeddings`` replaced by the model's own.

    ``all-linear`` is the leaf name of every linear layer but the output head, as peft's own ``all-linear``
    chooses; ``embeddings`` the input embedding's leaf name.
    Other names are kept as given, in order, without repeats; a name that finds nothing stays, to match nothing.

    Args:
        model: the base causal LM (a meta model will do).
        targets: ``lora.target_modules``.
        extras: ``lora.extra_trainable``.

    Returns:
        ``(target_modules, extra_trainable)`` as peft is given them.
    """
    from ctxext.recipe.sections import ALL_LINEAR, INPUT_EMBEDDINGS

    def expand(names: list[str], symbol: str, found: list[str]) -> list[str]:
        out = [n for name in names for n in ((found or [name]) if name == symbol else [name])]
        return list(dict.fromkeys(out))

    linear: list[str] = []
    if ALL_LINEAR in targets:
        head = _leaf_of(model, model.get_output_embeddings()) if hasattr(model, "get_output_embeddings") else None
        linear = sorted(_linear_leaves(model) - {head})
    embedding: list[str] = []
    if INPUT_EMBEDDINGS in extras and hasattr(model, "get_input_embeddings"):
        leaf = _leaf_of(model, model.get_input_embeddings())
        embedding = [leaf] if leaf else []
    return expand(targets, ALL_LINEAR, linear), expand(extras, INPUT_EMBEDDINGS, embedding)


def matched_modules(model: Any, suffixes: list[str]) -> list[str]:
    """Module paths of ``model`` that end with one of ``suffixes``: the rule peft applies to ``modules_to_save``."""
    return [name for name, _ in model.named_modules() if name and any(name.endswith(s) for s in suffixes)]


def _known_names(model: Any, key: str) -> str:
    # The names this architecture uses, as a recipe override; empty for an architecture not listed.
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in LORA_NAMES:
        return ""
    names = LORA_NAMES[model_type][0 if key == "target_modules" else 1]
    return f"; for {model_type} set lora.{key}=[{','.join(names)}]"


def lora_module_problems(model: Any, lora: Any) -> list[Problem]:
    """``(key, message)`` for LoRA target and extra modules that match no module of ``model`` (a meta model will do).

    Args:
        model: the base causal LM (only its module names, types and config's ``model_type`` are read).
        lora: the recipe's ``lora`` section.
    """
    problems = []
    names = [n for n, _ in model.named_modules()]
    targets, extras = resolve_lora_names(model, list(lora.target_modules), list(lora.extra_trainable))
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted(_linear_leaves(model))
        problems.append(
            (
                "lora.target_modules",
                f"{', '.join(missing)} match no module of this model; its linear layers are named: "
                f"{', '.join(leaves)}{_known_names(model, 'target_modules')}",
            )
        )
    extra = matched_modules(model, extras)
    unmatched = [s for s in extras if not any(n.endswith(s) for n in extra)]
    if unmatched:
        problems.append(
            (
                "lora.extra_trainable",
                f"{', '.join(unmatched)} match no module name suffix of this model (e.g. embed_tokens, norm)"
                f"{_known_names(model, 'extra_trainable')}",
            )
        )
    return problems


def is_gated_mlp(mlp: Any) -> bool:
    """Whether an MLP is the gated gate/up/down kind the tiled MLP shards (Llama, Mistral, Qwen …)."""
    return all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def tiled_mlp_problem(model: Any) -> str | None:
    """Why ``train.memory.tiled_mlp`` cannot tile this model's MLPs (a meta model will do), or ``None``."""
    import torch

    mlps = [m.mlp for _, m in model.named_modules() if isinstance(getattr(m, "mlp", None), torch.nn.Module)]
    if mlps and all(is_gated_mlp(mlp) for mlp in mlps):
        return None
    kind = next((type(m).__name__ for m in mlps if not is_gated_mlp(m)), "none found")
    return (
        f"tiles the gated MLP (gate_proj, up_proj, down_proj, act_fn); this model's MLP is not one ({kind}). "
        "Set train.memory.tiled_mlp=false"
    )
