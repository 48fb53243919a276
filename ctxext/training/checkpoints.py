"""Accelerate checkpoints of a run: what they hold, saving them whole, resuming from the last one.

A checkpoint ``checkpoints/step-NNNNNNN`` holds the trainable weights, the optimizer, the scheduler,
the RNG states and the step / token counters. It is written under a hidden name and renamed, so a
checkpoint folder that exists is whole; only the last ``train.keep_checkpoints`` are kept.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from ctxext.errors import InputError, is_disk_full


class Counters:
    """Step and token counters, checkpointed with the accelerate state."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens_seen = 0

    def state_dict(self) -> dict[str, int]:
        """For accelerate's ``save_state``."""
        return {"step": self.step, "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """For accelerate's ``load_state``."""
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])


def step_of(checkpoint: Path) -> int:
    """The step number of a ``step-NNNNNNN`` checkpoint folder."""
    return int(checkpoint.name.split("-")[1])


class Checkpoints:
    """The checkpoints of one run folder.

    Args:
        root: the ``checkpoints`` folder.
        accelerator: the run's accelerator.
        keep: how many checkpoints to keep (the newest).
    """

    def __init__(self, root: Path, accelerator: Any, keep: int):
        self.root = root
        self.accelerator = accelerator
        self.keep = keep

    def saved(self) -> list[Path]:
        """The complete checkpoints, oldest first."""
        return sorted(self.root.glob("step-*"), key=step_of)

    def register(self, model: Any, scheduler: Any, counters: Counters) -> None:
        """Make the scheduler and the counters part of every checkpoint, and keep the frozen base out of it."""
        # The scheduler is stepped by hand once per optimizer step (accelerate would step it once per process).
        self.accelerator.register_for_checkpointing(scheduler, counters)
        # Named as in the state dicts accelerate saves: the unwrapped model's names (DDP would add "module.", and
        # the filter below would then keep nothing: an empty checkpoint that resumes from the initial weights).
        unwrapped = self.accelerator.unwrap_model(model)
        trainable_keys = {n for n, p in unwrapped.named_parameters() if p.requires_grad}

        def keep_trainable(models: list, weights: list, output_dir: str) -> None:
            # Checkpoints hold only the trained weights: the frozen (4-bit) base is the same at every step.
            for i, state in enumerate(weights):
                weights[i] = {k: v for k, v in state.items() if k in trainable_keys}

        self.accelerator.register_save_state_pre_hook(keep_trainable)

    def resume(self, counters: Counters) -> None:
        """Load the newest checkpoint (weights, optimizer, scheduler, RNG, counters), if there is one.

        Raises:
            InputError: the newest checkpoint cannot be loaded (the message names the one before it).
        """
        ckpts = self.saved()
        if not ckpts:
            self.accelerator.print(f"no checkpoint in {self.root} yet: starting from step 0")
            return
        try:
            self.accelerator.load_state(str(ckpts[-1]), strict=False)
        except Exception as exc:  # torch / safetensors / accelerate raise many types for a damaged file
            earlier = f"; the one before it is {ckpts[-2]}" if len(ckpts) > 1 else ""
            raise InputError(
                f"--resume: checkpoint {ckpts[-1]} cannot be loaded ({type(exc).__name__}: "
                f"{str(exc).strip()[:200] or 'damaged'}). Move that folder away to resume from the previous "
                f"checkpoint{earlier}, or start over in a new output.dir."
            ) from None
        self.accelerator.print(f"resumed from {ckpts[-1]} (step {counters.step})")

    def save(self, step: int) -> None:
        """Save the state at ``step`` (all processes take part), then drop all but the newest ``keep``."""
        import shutil

        accelerator, main = self.accelerator, self.accelerator.is_main_process
        final = self.root / f"step-{step:07d}"
        tmp = self.root / f".tmp-step-{step:07d}"
        if main and tmp.exists():
            shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        try:
            accelerator.save_state(str(tmp))
        except BaseException as exc:
            # A full disk (or a stop) mid-save: no half checkpoint is left to look like the newest one.
            full = isinstance(exc, Exception) and is_disk_full(exc, self.root)
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            if full:  # torch's writer says "iostream error": name the cause, so the run ends resumable
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp)) from exc
            raise
        accelerator.wait_for_everyone()
        if main:
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)  # a checkpoint folder that exists is whole
            for stale in self.saved()[: -self.keep]:
                shutil.rmtree(stale, ignore_errors=True)
        accelerator.wait_for_everyone()
