"""Reading what ``ctxext train`` leaves behind: a run folder, its evaluation reports, and a merged model folder.

The run folder contract (written by training, read here by merge, model card and push)::

    <run>/adapter_config.json, adapter_model.safetensors   LoRA + fully trained modules (modules_to_save)
    <run>/config.json                                      the patched base config (rope_parameters, ctxext)
    <run>/tokenizer files, recipe.yaml, versions.json, metrics.jsonl, checkpoints/
    <run>/run.json      {"status": "running" | "complete" | "failed", "base_model", "base_model_resolved",
                         "method", "rope_parameters", "original_length", "target_length", "seq_len",
                         "steps", "tokens_seen", "quantization", "lora", "extra_trainable", ...}
    <run>/eval/report.json (+ PNG plots)                   from ``ctxext eval``
    <run>/calibration.json                                 from ``ctxext calibrate`` (the attention temperature)

``find_adapter_dir`` finds a run's (or any peft folder's) adapter.

A folder written by ``ctxext merge`` carries the run's ``run.json`` inside ``ctxext_merge.json`` and
a copy of the run's evaluation reports under ``eval/``, so it can be published on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.artifacts.report import EvalReport, read_report
from ctxext.errors import InputError

RUN_FILE = "run.json"
MERGE_FILE = "ctxext_merge.json"
# Keys every run.json must have for merge / card / push to make sense of it.
_REQUIRED_RUN_KEYS = ("status", "base_model", "method", "target_length")


class IncompleteRunError(InputError):
    """A run whose training did not finish (``run.json`` status is not ``complete``)."""


def resume_command(run_dir: str | Path) -> str:
    """The shell command that resumes the run in ``run_dir``, quoted so that any path works when pasted."""
    import shlex

    run_dir = Path(run_dir)
    return f"ctxext train {shlex.quote(str(run_dir / 'recipe.yaml'))} {shlex.quote(f'output.dir={run_dir}')} --resume"


def read_run(run_dir: str | Path, allow_incomplete: bool = False) -> dict[str, Any]:
    """Read and check a run folder's ``run.json``.

    Args:
        run_dir: the run folder written by ``ctxext train``.
        allow_incomplete: accept a run whose status is not ``complete`` (``--force``).

    Returns:
        The ``run.json`` content, with ``run_dir`` (absolute path) added.

    Raises:
        InputError: not a run folder, or a ``run.json`` that cannot be read.
        IncompleteRunError: the run did not complete and ``allow_incomplete`` is false.
    """
    run_dir = Path(run_dir)
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        raise InputError(f"{run_dir} does not exist; pass the run folder written by `ctxext train`")
    if not path.is_file():
        raise InputError(
            f"{run_dir} is not a ctxext run folder (no {RUN_FILE}); pass the folder `ctxext train` wrote "
            "(its output.dir)"
        )
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} cannot be read as JSON ({exc}); the run folder is damaged") from None
    if not isinstance(info, dict):
        raise InputError(f"{path} must hold a JSON object")
    missing = [key for key in _REQUIRED_RUN_KEYS if key not in info]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}; it was not written by a complete `ctxext train`")
    status = info.get("status")
    if status != "complete" and not allow_incomplete:
        raise IncompleteRunError(
            f"{run_dir} holds an incomplete run, not complete (run.json status: {status!r}): its training was "
            f"interrupted or failed, so its adapter is not the final one. Finish it with `{resume_command(run_dir)}`, "
            "or pass --force to use the "
            "weights it has anyway."
        )
    info = dict(info)
    info["run_dir"] = str(run_dir.resolve())
    return info


def run_base_model(run_dir: str | Path) -> str:
    """The base model a run was trained from, as recorded in its ``run.json``.

    Args:
        run_dir: the run folder.

    Returns:
        A model reference (folder, Hub id or ``builtin:NAME``).

    Raises:
        InputError: ``run.json`` names no base model.
    """
    run = json.loads((Path(run_dir) / RUN_FILE).read_text())
    for key in ("base_model_resolved", "base_model"):
        value = run.get(key)
        if value and (key == "base_model" or Path(str(value)).exists()):
            return str(value)
    model_section = (run.get("recipe") or {}).get("model") or {}
    if model_section.get("path"):
        return str(model_section["path"])
    raise InputError(f"{run_dir}/run.json names no base model (base_model_resolved / base_model)")


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
    """Whether ``path`` holds a training run (``run.json`` + adapter)."""
    path = Path(path)
    return (path / RUN_FILE).is_file()


def is_merged_folder(path: str | Path) -> bool:
    """Whether ``path`` is a model folder written by ``ctxext merge``."""
    path = Path(path)
    return (path / MERGE_FILE).is_file() and (path / "config.json").is_file()


def read_merged(path: str | Path) -> dict[str, Any]:
    """Read the ``ctxext_merge.json`` of a merged model folder.

    Args:
        path: the merged folder.

    Returns:
        ``{"run": <run.json of the source run>, "smoke": <smoke-test results>, "source_run": ...}``.

    Raises:
        InputError: the file is missing or damaged.
    """
    file = Path(path) / MERGE_FILE
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{file} cannot be read ({exc}); merge the run again with `ctxext merge`") from None
    if not isinstance(data, dict) or not isinstance(data.get("run"), dict):
        raise InputError(f"{file} has no 'run' section; merge the run again with `ctxext merge`")
    return data


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


def plan_from_run(run: dict[str, Any], config: Any) -> Any:
    """The RoPE plan a run was trained with, rebuilt from its ``run.json`` (``None`` for ``method: none``).

    Verification of a merged model compares its runtime RoPE with this plan, not with the config it
    was saved with.

    Args:
        run: the run's ``run.json``.
        config: the base config (for the rotary dimension and ``max_position_embeddings``).

    Returns:
        A :class:`ctxext.rope.types.RopePlan`, or ``None``.
    """
    from ctxext.rope.read import read_rope
    from ctxext.rope.types import RopePlan

    params = run.get("rope_parameters")
    method = run.get("method")
    original, target = run.get("original_length"), run.get("target_length")
    if method in (None, "none") or not isinstance(params, dict) or not original or not target:
        return None
    state = read_rope(config)
    max_pos = int(original) if params.get("rope_type") == "dynamic" else int(target)
    return RopePlan(
        method=str(method),
        rope_parameters=dict(params),
        max_position_embeddings=max_pos,
        original_length=int(original),
        target_length=int(target),
        factor=int(target) / int(original),
        rotary_dim=state.rotary_dim,
    )


def check_run_base(run: dict[str, Any], what: str) -> None:
    """Check that the base weights a run names are still the ones it was trained on, when they are on disk.

    Runs written before fingerprints existed (no ``base_fingerprint``) and bases not present locally are
    not checked.

    Args:
        run: the run's ``run.json``.
        what: the command, for the message.

    Raises:
        InputError: the base's weights changed.
    """
    from ctxext.models.weights import check_fingerprint

    expected = run.get("base_fingerprint")
    base = run.get("base_model_resolved")
    if expected and base and (Path(str(base)) / "config.json").is_file():
        check_fingerprint(Path(str(base)), expected, what)
