"""Rules for splitting one sequence over processes (``train.sequence_parallel_size`` and the ring's size), torch-free.

The split (Ulysses, with torch's ring around it: ``ctxext.training.sequence_parallel``) attends causally over the
whole gathered row (each packed document on its own, found from the positions that restart at 0) and rotates each
shard at its global positions. That is exact for static RoPE methods, PoSE rows and rows of several documents; it is
not for the settings :func:`sequence_parallel_refusal` refuses (the schema calls it).

Which engine splits the heads, and whether any can, is decided here from the model's config alone
(:func:`ulysses_plan`), so ``ctxext validate`` (:mod:`ctxext.recipe.refusals`), ``ctxext train`` and the planner's
tests apply one rule; so are the ring's limits (:func:`ring_refusal`) and the launch's (:func:`check_split_launch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxext.errors import InputError

SPLIT_KEY = "train.sequence_parallel_size"
RING_KEY = "train.context_parallel_size"
DEEPSPEED_HINT = "pip install 'ctxext[deepspeed]'"

# RoPE methods whose frequencies depend on the length of the sequence processed (rope.LENGTH_DEPENDENT_TYPES holds
# the transformers rope types; these are the ctxext method names that produce them).
LENGTH_DEPENDENT_METHODS = frozenset({"dynamic", "longrope"})


def sequence_parallel_refusal(recipe: Any) -> str | None:
    """Why a recipe cannot split its sequences over several processes (either key), or ``None``.

    Args:
        recipe: a :class:`ctxext.recipe.schema.Recipe` whose sections are already validated.

    Returns:
        A message that names the key at fault and the way out, or ``None``.
    """
    size, ring = recipe.train.sequence_parallel_size, recipe.train.context_parallel_size
    if size == 1 and ring == 1:
        return None
    # The two compose (the ring around the head split): the rules below hold for either.
    key = f"train.sequence_parallel_size: {size}" if size > 1 else f"train.context_parallel_size: {ring}"
    if recipe.rope.method in LENGTH_DEPENDENT_METHODS:
        return (
            f"{key} with rope.method {recipe.rope.method!r}: its frequencies depend on the length of the sequence "
            "processed, and each process sees only its shard; use a static method (yarn, linear, ntk, llama3, "
            "theta) or set it to 1"
        )
    if recipe.model.attn_implementation == "eager":
        return (
            f"{key} needs sdpa or flash attention (eager builds a full mask the split cannot use); "
            "set model.attn_implementation: sdpa"
        )
    return None


@dataclass(frozen=True)
class UlyssesPlan:
    """How N processes share a model's attention heads (rank r attends with ``query[r]`` over the whole sequence).

    Attributes:
        engine: ``deepspeed`` (its attention serves the shape), ``ctxext`` (``ctxext.training.ulysses``), or
            ``none`` (N = 1).
        heads: query heads of the model.
        kv_heads: key/value heads of the model.
        query: per rank, its contiguous ``[start, stop)`` query heads (sizes differ by at most one).
        kv: per rank, the ``[start, stop)`` key/value heads its query heads read (overlapping: replicated).
    """

    engine: str
    heads: int
    kv_heads: int
    query: tuple[tuple[int, int], ...]
    kv: tuple[tuple[int, int], ...]

    @property
    def replicated_kv(self) -> int:
        """Key/value heads held by the ranks beyond the model's own (copies sent to a second rank or more)."""
        return sum(hi - lo for lo, hi in self.kv) - self.kv_heads


def ulysses_plan(heads: int, kv_heads: int, size: int) -> UlyssesPlan | str:
    """How ``size`` processes split a model with ``heads`` query and ``kv_heads`` key/value heads, or why they cannot.

    The one rule for the head split (train, validate and the tests call it): each rank needs at least one query
    head; query heads go out in contiguous, as-even-as-possible ranges with the key/value heads they read.
    DeepSpeed's attention serves the shape when ``size`` divides the query heads and either divides the key/value
    heads or is a multiple of them; any other shape is ctxext's own attention's.

    Returns:
        The :class:`UlyssesPlan`, or a refusal message (without the key) naming the way out.
    """
    if heads % kv_heads:
        return f"the model's {heads} attention heads are not a multiple of its {kv_heads} key/value heads"
    if size > heads:
        ulysses = _divisor(heads, size)
        return (
            f"exceeds the model's {heads} attention heads (each process attends with at least one): use at most "
            f"{heads}, and split further with {RING_KEY} (ring attention, CUDA), e.g. {SPLIT_KEY}={ulysses} "
            f"{RING_KEY}={size // ulysses}"
        )
    per_kv = heads // kv_heads
    bounds = [r * heads // size for r in range(size + 1)]
    query = tuple(zip(bounds[:-1], bounds[1:], strict=True))
    kv = tuple((lo // per_kv, (hi - 1) // per_kv + 1) for lo, hi in query)
    served = heads % size == 0 and (kv_heads % size == 0 or size % kv_heads == 0)
    engine = "none" if size == 1 else "deepspeed" if served else "ctxext"
    return UlyssesPlan(engine, heads, kv_heads, query, kv)


def _divisor(heads: int, size: int) -> int:
    """The largest divisor of ``size`` that is at most ``heads`` (the Ulysses part of a hybrid split)."""
    return max(k for k in range(1, heads + 1) if size % k == 0)


def split_plan(config: Any, size: int) -> UlyssesPlan | str:
    """:func:`ulysses_plan` for a model's config (a multimodal one's text config is read)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    return ulysses_plan(heads, kv, size)


def head_split_problem(config: Any, size: int, has_deepspeed: bool) -> str | None:
    """Why ``size`` processes cannot split this model's heads here (message without the key), or ``None``.

    Args:
        config: the model's config.
        size: ``train.sequence_parallel_size``.
        has_deepspeed: DeepSpeed is installed (its attention serves the shapes it can; ctxext's the others).
    """
    plan = split_plan(config, size)
    if isinstance(plan, str):
        return f"{size} {plan}"
    if plan.engine == "deepspeed" and not has_deepspeed:
        return f"{size} splits this model's {plan.heads} heads with DeepSpeed's Ulysses attention; {DEEPSPEED_HINT}"
    return None


def ring_refusal(config: Any, attn_implementation: str, cuda: bool) -> str | None:
    """Why torch's ring attention cannot run this model here (message without the key), or ``None``.

    Args:
        config: the model's config (``None``: not read, the window is not checked).
        attn_implementation: the resolved attention implementation.
        cuda: whether CUDA is available (the ring dispatches only CUDA SDPA kernels).
    """
    if not cuda:
        return "torch's ring attention (context parallelism) runs only CUDA SDPA kernels; set it to 1 on this machine"
    if attn_implementation != "sdpa":
        return f"the ring replaces SDPA, not {attn_implementation}; set model.attn_implementation: sdpa"
    if config is None:  # a Hub model's config is not fetched before training: train checks the window
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None)
    # transformers' own rule (PreTrainedModel.supports_context_parallel), on the config alone.
    if layer_types:
        windowed = any(t != "full_attention" for t in layer_types)
    else:
        windowed = getattr(text, "sliding_window", None) is not None
    if windowed:
        return "the ring expresses only full causal attention, and this model's layers attend within a window"
    return None


def check_split_launch(size: int, num_processes: int, context_parallel: int = 1) -> None:
    """Refuse a split this launch cannot make, before anything is loaded or written.

    ``ctxext train`` calls it from the launcher's ``WORLD_SIZE`` once the recipe is checked, and again once
    accelerate has started the processes; ``ctxext validate`` cannot know the launch and warns.

    Raises:
        InputError: the processes of one sequence (``size × context_parallel``) not dividing the launch.
    """
    group = size * context_parallel
    if num_processes % group:
        both = f"{SPLIT_KEY} × {RING_KEY} = {group}" if context_parallel > 1 else f"{SPLIT_KEY}: {size}"
        raise InputError(
            f"{both} does not divide the {num_processes} process(es) of this launch; launch a multiple of "
            f"{group} (e.g. `accelerate launch --num_processes {group} -m ctxext train ...`; on the CPU add "
            f"`--multi_gpu` and ACCELERATE_USE_CPU=true) or set {SPLIT_KEY}=1"
        )
