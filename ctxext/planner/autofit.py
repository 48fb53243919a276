"""What a recipe leaves to the machine: ``train.gradient_checkpointing: auto`` and ``train.memory.fit_micro_batch``.

One recipe for any base cannot know the device. The default recipe's grown models train fastest without
recomputation and with 8 rows per micro-batch; the same file on SmolLM2-135M at 32,768 tokens plans 681 GiB per
process on an 80 GB GPU. So the choice is made once, before anything is loaded, from the planned step on the
device (it fits when the upper end of the plan's band is within the usable memory, :func:`ctxext.planner.fit.fits`):
the first of these that fits is kept.

1. The recipe as given (checkpointing off where it says ``auto``).
2. Smaller micro-batches, each a divisor of the recipe's, with the gradient accumulation raised by the same factor
   (a step sees the same rows, the same tokens). One long row keeps a device busy, so a smaller micro-batch costs
   little time, where recomputation costs every step about a third more compute
   (:func:`ctxext.planner.plan.flops_per_token`).
3. Checkpointing on, with the largest of those micro-batches that fits.

When none fits, the last is kept (the most memory saved) and the plan says that it does not fit, with its advice.
``ctxext plan`` shows the choice for the device it plans; ``ctxext train`` and ``ctxext demo`` make it for the
machine they run on and write it into the run's ``recipe.yaml``, which ``--resume`` keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ctxext.planner.footprint import Setup

CHECKPOINTING = "train.gradient_checkpointing"
MICRO_BATCH = "train.micro_batch_size"
ACCUMULATION = "train.gradient_accumulation_steps"
KEYS = (CHECKPOINTING, MICRO_BATCH, ACCUMULATION)


@dataclass
class Choice:
    """What was decided for the settings a recipe left to the machine.

    Attributes:
        overrides: recipe key → chosen value, for each key the choice may set (``train.gradient_checkpointing``
            when it was ``auto``; the micro-batch and accumulation when the micro-batch may be fitted).
        line: the decision and why, in one line.
        fits: whether the chosen step fits the device.
        as_given: the recipe's own micro-batch without recomputation fits (nothing was lowered or turned on).
    """

    overrides: dict[str, Any] = field(default_factory=dict)
    line: str = ""
    fits: bool = True
    as_given: bool = True


def left_to_machine(recipe: Any) -> bool:
    """Whether the recipe leaves a setting to the machine (auto checkpointing, or a micro-batch that may shrink)."""
    train = recipe.train
    return train.gradient_checkpointing == "auto" or (train.memory.fit_micro_batch and train.micro_batch_size > 1)


def with_overrides(recipe: Any, overrides: dict[str, Any]) -> Any:
    """A copy of a validated recipe with :data:`KEYS` set (validated on assignment)."""
    if not overrides:
        return recipe
    out = recipe.model_copy(deep=True)
    for key, value in overrides.items():
        if key not in KEYS:
            raise ValueError(f"{key}: not a setting left to the machine")
        setattr(out.train, key.split(".", 1)[1], value)
    return out


def saved_overrides(recipe: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """The choice a run made when it started, from its ``recipe.yaml`` (``saved``), for ``--resume`` to keep.

    Only what ``recipe`` leaves to the machine is taken: checkpointing where it says ``auto``; the micro-batch and
    accumulation where the micro-batch may be fitted and the two give the same rows per step as the recipe's. A
    resumed run keeps its batches even on a machine with other memory (its data order depends on them).
    """
    train, old = recipe.train, (saved.get("train") or {})
    out: dict[str, Any] = {}
    if train.gradient_checkpointing == "auto" and isinstance(old.get("gradient_checkpointing"), bool):
        out[CHECKPOINTING] = old["gradient_checkpointing"]
    mb, ga = old.get("micro_batch_size"), old.get("gradient_accumulation_steps")
    rows = train.micro_batch_size * train.gradient_accumulation_steps
    if train.memory.fit_micro_batch and isinstance(mb, int) and isinstance(ga, int) and mb * ga == rows:
        out |= {MICRO_BATCH: mb, ACCUMULATION: ga}
    return out


def _micro_batches(recipe: Any, setup: Setup) -> list[int]:
    """The micro-batches to try, largest first: the recipe's, then its divisors when it may be fitted."""
    mb = recipe.train.micro_batch_size
    # DeepSpeed (ZeRO-3, Ulysses) takes accumulation 1 (ctxext.training.launch.configure_deepspeed): there a smaller
    # micro-batch would be a smaller batch, which is the user's call.
    deepspeed = setup.sharding == "zero3" or setup.sequence_parallel > 1
    if not recipe.train.memory.fit_micro_batch or deepspeed:
        return [mb]
    return [d for d in range(mb, 0, -1) if mb % d == 0]


def choose(
    recipe: Any,
    setup_of: Callable[[Any], Setup],
    planned: Callable[[Setup], int],
    usable: int,
    device: str,
) -> Choice:
    """The settings the recipe leaves to the machine, decided for one device.

    Args:
        recipe: a validated recipe (:func:`left_to_machine`).
        setup_of: the training setup of a recipe on the device (:func:`ctxext.planner.plan.setup_for`).
        planned: the upper end of a setup's planned peak on the device, bytes.
        usable: the device's usable memory, bytes.
        device: the device's name, for the line.

    Returns:
        The :class:`Choice`.
    """
    train = recipe.train
    auto = train.gradient_checkpointing == "auto"
    mb0, ga0 = train.micro_batch_size, train.gradient_accumulation_steps
    overrides: dict[str, Any] = {}
    start = with_overrides(recipe, {CHECKPOINTING: False} if auto else {})
    micro = _micro_batches(start, setup_of(start))
    candidates = [(ckpt, mb) for ckpt in ([False, True] if auto else [train.checkpointing]) for mb in micro]
    gib = 2**30
    peaks: list[int] = []
    for ckpt, mb in candidates:
        overrides = {CHECKPOINTING: ckpt} if auto else {}
        if len(micro) > 1:
            overrides |= {MICRO_BATCH: mb, ACCUMULATION: ga0 * mb0 // mb}
        peaks.append(planned(setup_of(with_overrides(recipe, overrides))))
        if peaks[-1] <= usable:
            break
    peak, room = peaks[-1], f"{usable / gib:.1f} usable GiB on {device}"
    changed = [f"{k} {_text(recipe, k)} → {_text_value(v)}" for k, v in overrides.items() if value_of(recipe, k) != v]
    same_rows = " (the same rows per step)" if overrides.get(MICRO_BATCH, mb0) != mb0 else ""
    if peak > usable:
        line = (
            f"settings left to the machine: {', '.join(changed) or 'as given'}{same_rows}, the most memory they "
            f"save, and the step still plans {peak / gib:.1f} GiB at its band's upper end, of {room}"
        )
    elif len(peaks) == 1:
        how = "without recomputation, " if auto else ""
        line = (
            f"settings left to the machine: {', '.join(changed) or 'as given'}: the step fits {how}with the "
            f"recipe's micro-batch ({peak / gib:.1f} GiB at its band's upper end, of {room})"
        )
    else:
        line = (
            f"settings left to the machine: {', '.join(changed)}{same_rows}: the step plans {peaks[0] / gib:.1f} GiB "
            f"at its band's upper end as the recipe gives it, {peak / gib:.1f} with these, of {room}"
        )
    return Choice(overrides=overrides, line=line, fits=peak <= usable, as_given=len(peaks) == 1)


def value_of(recipe: Any, key: str) -> Any:
    """A recipe's value of one of :data:`KEYS`."""
    return getattr(recipe.train, key.split(".", 1)[1])


def _text(recipe: Any, key: str) -> str:
    return _text_value(value_of(recipe, key))


def _text_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
