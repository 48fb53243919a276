"""Reading what ``ctxext train`` leaves behind: a run folder, its evaluation reports, and a merged model folder.

The run folder contract (written by training, read here by merge, model card and push)::

    <run>/adapter_config.json, adapter_model.safetensors   LoRA + fully trained modules (modules_to_save)
    <run>/model.safetensors (instead, ``train.mode: full``) every weight: the run folder is a complete model
    <run>/config.json                                      the patched base config (rope_parameters, ctxext)
    <run>/tokenizer files, recipe.yaml, versions.json, metrics.jsonl, checkpoints/
    <run>/run.json                                         the run record (:class:`RunRecord`)
    <run>/eval/report.json (+ PNG plots)                   from ``ctxext eval``
    <run>/calibration.json                                 from ``ctxext calibrate`` (the attention temperature)

``find_adapter_dir`` finds a run's (or any peft folder's) adapter. A full fine-tune's run folder (:func:`is_full_run`)
is a plain checkpoint: it loads, evaluates and exports as any model folder does, and there is nothing to merge.

A folder written by ``ctxext merge`` carries the run's record inside ``ctxext_merge.json`` (:class:`MergedRecord`)
and a copy of the run's evaluation reports under ``eval/``, so it can be published on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.artifacts.report import EvalReport, read_report
from ctxext.artifacts.run_record import MERGE_FILE, RUN_FILE, MergedRecord, RunRecord
from ctxext.errors import InputError

METRICS_FILE = "metrics.jsonl"  # one JSON object per logged step, written by training's loop

__all__ = [
    "MERGE_FILE",
    "METRICS_FILE",
    "RUN_FILE",
    "IncompleteRunError",
    "MergedRecord",
    "Report",
    "RunRecord",
    "find_adapter_dir",
    "find_reports",
    "is_full_run",
    "is_merged_folder",
    "is_run_folder",
    "load_report",
    "plan_from_run",
    "read_merged",
    "read_run",
    "resume_command",
    "run_base_model",
    "training_seconds",
]


class IncompleteRunError(InputError):
    """A run whose training did not finish (``run.json`` status is not ``complete``)."""


def resume_command(run_dir: str | Path) -> str:
    """The shell command that resumes the run in ``run_dir``, quoted so that any path works when pasted."""
    import shlex

    run_dir = Path(run_dir)
    return f"ctxext train {shlex.quote(str(run_dir / 'recipe.yaml'))} {shlex.quote(f'output.dir={run_dir}')} --resume"


def training_seconds(run_dir: str | Path) -> float | None:
    """The seconds a run's optimizer steps took, from its step log (``metrics.jsonl``; a resumed run's steps once).

    Each step's tokens over its tokens per second, summed: the time spent training, without the validation,
    probe and checkpoint pauses between steps.

    Returns:
        The seconds, or ``None`` when the run logged no timed step (no log, or an unreadable one).
    """
    import json

    path = Path(run_dir) / METRICS_FILE
    try:
        logged = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return None
    steps = {s["step"]: s for s in logged if isinstance(s, dict) and s.get("tokens_per_sec") and "step" in s}
    seconds, seen = 0.0, 0
    for step in sorted(steps):  # a step logged twice (a resume from an earlier checkpoint) counts once
        tokens = steps[step].get("tokens_seen", 0)
        seconds += max(tokens - seen, 0) / steps[step]["tokens_per_sec"]
        seen = tokens
    return seconds or None


def read_run(run_dir: str | Path, allow_incomplete: bool = False, force_flag: str | None = "--force") -> RunRecord:
    """Read a run folder's record, refusing an unfinished run unless asked.

    Args:
        run_dir: the run folder written by ``ctxext train``.
        allow_incomplete: accept a run whose status is not ``complete`` (``--force``).
        force_flag: the calling command's flag that accepts an unfinished run, named in the refusal; ``None``
            for a command that has none (the message then names only resuming the run).

    Returns:
        The :class:`RunRecord` (its ``folder`` is the run folder, absolute).

    Raises:
        InputError: not a run folder, or a ``run.json`` that cannot be read.
        IncompleteRunError: the run did not complete and ``allow_incomplete`` is false.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a folder" if run_dir.exists() else "does not exist"
        raise InputError(f"{run_dir} {what}; pass the run folder written by `ctxext train`")
    record = RunRecord.read(run_dir)
    if not record.complete and not allow_incomplete:
        raise IncompleteRunError(
            f"{run_dir} holds an incomplete run, not complete (run.json status: {record.status!r}): its training "
            f"was interrupted or failed, so its adapter is not the final one. Finish it with "
            f"`{resume_command(run_dir)}`"
            + (f", or pass {force_flag} to use the weights it has anyway." if force_flag else ".")
        )
    return record


def run_base_model(run: RunRecord | str | Path) -> str:
    """The base model a run was trained from: the folder it was loaded from while that exists, else as named.

    Args:
        run: the run's record, or its folder.

    Returns:
        A model reference (folder, Hub id or ``builtin:NAME``).
    """
    record = run if isinstance(run, RunRecord) else RunRecord.read(run)
    resolved = record.base_model_resolved
    return resolved if resolved and Path(resolved).exists() else record.base_model


def find_adapter_dir(path: str | Path) -> Path | None:
    """The folder holding a peft adapter: ``path`` itself, or its ``adapter`` / ``final`` subfolder.

    Args:
        path: an adapter folder or a ctxext run folder.

    Returns:
        The folder with ``adapter_config.json``, or ``None``.
    """
    path = Path(path)
    for cand in (path, path / "adapter", path / "final"):
        if (cand / "adapter_config.json").is_file():
            return cand
    return None


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` holds a training run of an adapter (``run.json`` + adapter): a base plus what it trained.

    A full fine-tune's run folder is not one: it is a complete model (:func:`is_full_run`), used as a model folder.
    """
    path = Path(path)
    return (path / RUN_FILE).is_file() and not is_full_run(path)


def is_full_run(path: str | Path) -> bool:
    """Whether ``path`` holds a full fine-tune's run (``run.json`` of ``mode: full``): a complete model folder."""
    import json

    try:
        record = json.loads((Path(path) / RUN_FILE).read_text())
    except (OSError, ValueError):  # no record, or a damaged one (named by whoever reads it)
        return False
    return isinstance(record, dict) and record.get("mode") == "full"


def is_merged_folder(path: str | Path) -> bool:
    """Whether ``path`` is a model folder written by ``ctxext merge``."""
    path = Path(path)
    return (path / MERGE_FILE).is_file() and (path / "config.json").is_file()


def read_merged(path: str | Path) -> MergedRecord:
    """Read the ``ctxext_merge.json`` of a merged model folder (:meth:`MergedRecord.read`).

    Raises:
        InputError: the file is missing or damaged.
    """
    return MergedRecord.read(path)


@dataclass
class Report:
    """One evaluation report (``ctxext eval`` output) and the folder its plots live in.

    Attributes:
        path: the ``report.json`` file.
        data: its content, validated against the report schema.
        plots: PNG files next to it.
    """

    path: Path
    data: EvalReport
    plots: list[Path] = field(default_factory=list)

    @property
    def label(self) -> str:
        """A short name: the report's folder name (``eval``, or a subfolder name)."""
        return self.path.parent.name


def load_report(path: str | Path) -> Report:
    """Load one ``report.json`` (validated against :mod:`ctxext.artifacts.report`) and list the PNG plots beside it.

    Args:
        path: a report file, or a folder holding ``report.json``.

    Returns:
        The :class:`Report`.

    Raises:
        InputError: the file does not exist, is not JSON, or is not a report of the schema this ctxext reads.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    data = read_report(path)
    plots = sorted(p for p in path.parent.glob("*.png") if p.is_file())
    return Report(path=path, data=data, plots=plots)


def find_reports(folder: str | Path) -> list[Report]:
    """The evaluation reports inside a run (or merged) folder: ``eval/report.json`` and ``eval/*/report.json``.

    Args:
        folder: a run folder or a merged model folder.

    Returns:
        Reports in path order (possibly none).
    """
    root = Path(folder) / "eval"
    paths = []
    if (root / "report.json").is_file():
        paths.append(root / "report.json")
    if root.is_dir():
        paths.extend(sorted(p for p in root.glob("*/report.json") if p.is_file()))
    return [load_report(p) for p in paths]


def plan_from_run(run: RunRecord, config: Any) -> Any:
    """The RoPE plan a run was trained with, rebuilt from its record (``None`` for ``method: none``).

    Verification of a merged model compares its runtime RoPE with this plan, not with the config it
    was saved with.

    Args:
        run: the run's record.
        config: the base config (for the rotary dimension and ``max_position_embeddings``).

    Returns:
        A :class:`ctxext.rope.types.RopePlan`, or ``None``.
    """
    from ctxext.rope.read import read_rope
    from ctxext.rope.types import RopePlan

    params, original, target = run.rope_parameters, run.original_length, run.target_length
    if run.method == "none" or not params or not original or not target:
        return None
    state = read_rope(config)
    max_pos = original if params.get("rope_type") == "dynamic" else target
    return RopePlan(
        method=run.method,
        rope_parameters=dict(params),
        max_position_embeddings=max_pos,
        original_length=original,
        target_length=target,
        factor=target / original,
        rotary_dim=state.rotary_dim,
    )
