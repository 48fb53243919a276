"""lm-evaluation-harness on the model ctxext loaded and verified: the ``harness`` section's engine.

``lm_eval --model hf --model_args pretrained=DIR`` rebuilds the model from its folder; ctxext instead hands
lm-eval the model object it loaded and whose runtime RoPE it checked against its reference
(``HFLM(pretrained=<model>, tokenizer=..., max_length=...)``), so no rebuild can drop a RoPE scaling (a run
folder's adapter included). Tasks are lm-eval's own (their data must be in the local ``datasets`` cache when
offline) or the folder written by ``ctxext tasks export`` (``include_path``). Results go into the report under
``harness``: lm-eval's metrics per task and, per document, the first metric (``outcomes``) for paired reading.

Before the model is loaded every task name is checked against lm-eval's task index and every task's data is
loaded once, so an unknown task or a data set that is not available offline is an :class:`InputError`
naming it, not a failure after the model ran (with ``HF_HUB_OFFLINE=1`` ``datasets`` fails at once instead of
retrying the Hub).

lm-eval generates with the KV cache on and with the checkpoint's ``generation_config`` as defaults (its task
files set ``do_sample: false``): for ``dynamic`` / ``longrope`` RoPE cached decoding differs from a full
forward pass (transformers#25104), which the section notes.
"""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxext.errors import InputError
from ctxext.evaluation.sections.harness.settings import HarnessSettings

if TYPE_CHECKING:
    from ctxext.models.load import LoadedModel

HARNESS = "lm-evaluation-harness"
INSTALL_HINT = "pip install 'ctxext[harness]' (lm-eval>=0.4.13)"
# lm-eval's own default answer budget, used for max_length when the tasks are not ctxext's export.
DEFAULT_GEN_TOKS = 256


def _require_lm_eval() -> Any:
    try:
        import lm_eval
    except ImportError:
        raise InputError(f"`ctxext eval harness` needs lm-evaluation-harness: {INSTALL_HINT}") from None
    return lm_eval


def task_manager(settings: HarnessSettings) -> Any:
    """lm-eval's task index for the settings; unknown task names are an :class:`InputError` naming them.

    Only the ``include_path`` folder is indexed when it holds every named task (indexing all of lm-eval's
    tasks takes seconds); lm-eval's own tasks are added otherwise.
    """
    _require_lm_eval()
    from lm_eval.tasks import TaskManager

    include = settings.include_path
    if include is not None and not Path(include).is_dir():
        raise InputError(f"--include-path {include}: no such folder (write one with `ctxext tasks export`)")
    if include is not None:
        from ctxext.evaluation.export_tasks import missing_data

        missing = missing_data(include)
        if missing:
            raise InputError(
                f"--include-path {include}: {', '.join(str(m) for m in missing)} missing, so its tasks have no "
                "documents; copy the whole export folder, or export the tasks again with `ctxext tasks export`"
            )
    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(t in local.all_tasks for t in settings.tasks):
            return local
    manager = TaskManager(include_path=include)
    unknown = [t for t in settings.tasks if t not in manager.all_tasks]
    if unknown:
        hints = {t: difflib.get_close_matches(t, manager.all_tasks, n=3) for t in unknown}
        near = "; ".join(f"{t}: did you mean {', '.join(h)}?" for t, h in hints.items() if h)
        where = f" or in {include}" if include else " (pass --include-path for exported tasks)"
        raise InputError(
            f"unknown lm-eval task(s) {', '.join(unknown)}: not in lm-eval {_version()}'s tasks{where}. "
            f"{near + ' ' if near else ''}List them with `lm_eval ls tasks`"
        )
    return manager


def check_task_data(settings: HarnessSettings, manager: Any) -> None:
    """Load every task's data once (cheap next to the evaluation); a missing data set is an :class:`InputError`."""
    try:
        manager.load(list(settings.tasks))
    except (ConnectionError, FileNotFoundError, OSError, ValueError) as exc:
        # datasets raises ConnectionError (offline / unreachable Hub), DatasetNotFoundError (a FileNotFoundError)
        # or a ValueError naming a missing config; each message names the data set.
        raise InputError(
            f"lm-eval task(s) {', '.join(settings.tasks)}: their data could not be loaded ({type(exc).__name__}: "
            f"{exc}). Offline, a task's data set must already be in the local datasets cache; or export ctxext's "
            "own tasks with `ctxext tasks export` and pass --include-path"
        ) from None


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def default_max_length(loaded: LoadedModel, settings: HarnessSettings) -> int:
    """``max_length`` for lm-eval: the settings', else the model's context plus the answer budget.

    For an export (``include_path`` written by ``ctxext tasks export``) it also checks that its prompts fit: a
    task longer than the model's context is refused unless ``allow_beyond_context`` (and then ``max_length``
    covers it), and a ``max_length`` below a task's length plus its budget is refused, because lm-eval would
    silently cut the prompt from the left.

    Raises:
        InputError: an exported task beyond the context, or a ``max_length`` too small for one.
    """
    from ctxext.evaluation.export_tasks import read_export

    export = read_export(settings.include_path) if settings.include_path else None
    tasks = export["tasks"] if export else []
    longest = max(tasks, key=lambda t: t["length"], default=None)
    if longest and longest["length"] > loaded.context_length and not settings.allow_beyond_context:
        raise InputError(
            f"exported task {longest['name']} is {longest['length']} tokens, beyond the context of {loaded.name} "
            f"({loaded.context_length}); pass --allow-beyond-context to run it anyway"
        )
    need = max((t["length"] + t["max_gen_toks"] for t in tasks), default=0)
    if settings.max_length is not None:
        if settings.max_length < need:
            raise InputError(
                f"--max-length {settings.max_length} is below what the exported tasks need ({need}: length + answer "
                "budget); lm-eval would cut their prompts from the left. Raise it or leave it unset"
            )
        return settings.max_length
    budget = max((t["max_gen_toks"] for t in tasks), default=0) if export else DEFAULT_GEN_TOKS
    return max(loaded.context_length + budget, need)


def run_harness(loaded: LoadedModel, settings: HarnessSettings, manager: Any | None = None) -> dict[str, Any]:
    """Evaluate one loaded (and RoPE-verified) model with lm-eval's ``simple_evaluate``.

    Args:
        loaded: the model ctxext loaded (its object is passed to lm-eval, never rebuilt from a folder).
        settings: tasks, include path, batch size, ``max_length``, limit, few-shot.
        manager: a task index from :func:`task_manager` (built here when ``None``).

    Returns:
        The ``harness`` section of the model's report entry.

    Raises:
        InputError: lm-eval missing, an unknown task, or task data that cannot be loaded.
    """
    lm_eval = _require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES

    manager = manager or task_manager(settings)
    max_length = default_max_length(loaded, settings)
    started = time.perf_counter()
    model = HFLM(
        pretrained=loaded.model, tokenizer=loaded.tokenizer, max_length=max_length, batch_size=settings.batch_size
    )
    try:
        results = lm_eval.simple_evaluate(
            model=model,
            tasks=list(settings.tasks),
            task_manager=manager,
            num_fewshot=settings.num_fewshot,
            limit=settings.limit,
            log_samples=True,
        )
    except (ConnectionError, FileNotFoundError) as exc:
        raise InputError(f"lm-eval could not load a task's data ({exc}); see `ctxext eval harness --help`") from None
    notes = []
    if loaded.rope.rope_type in LENGTH_DEPENDENT_TYPES:
        notes.append(
            f"rope_type {loaded.rope.rope_type}: lm-eval decodes with a KV cache, whose keys keep the rotation of "
            "the prompt length (transformers#25104); ctxext's own grids score without one"
        )
    return {
        "harness": HARNESS,
        "version": _version(),
        "model_args": f"pretrained=<the model ctxext loaded: {loaded.info.get('ref')}>, max_length={max_length}",
        "settings": settings.model_dump() | {"max_length": max_length},
        "tasks": _task_results(results),
        "notes": notes,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _metric_name(key: str) -> str:
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else key


def _task_results(results: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's ``results`` per task (metrics without the ``,none`` filter suffix), with per-document outcomes."""
    out: dict[str, Any] = {}
    samples = results.get("samples") or {}
    for name, raw in results["results"].items():
        metrics = {
            _metric_name(k): v for k, v in raw.items() if "," in k and isinstance(v, (int, float)) and "stderr" not in k
        }
        stderr = {_metric_name(k.replace("_stderr", "")): v for k, v in raw.items() if "_stderr," in k}
        entry: dict[str, Any] = {
            "metrics": metrics,
            "stderr": {k: v if isinstance(v, (int, float)) else None for k, v in stderr.items()},
            "documents": raw.get("sample_len") or len(samples.get(name, [])),
            "n_shot": (results.get("n-shot") or {}).get(name),
            "version": (results.get("versions") or {}).get(name),
        }
        docs = sorted(samples.get(name, []), key=lambda s: s["doc_id"])
        if docs and metrics:
            first = next(iter(metrics))
            entry["metric"] = first
            entry["outcomes"] = [float(s.get(first, 0.0)) for s in docs]
            entry["examples"] = [
                {"doc_id": s["doc_id"], "target": s.get("target"), "output": (s.get("filtered_resps") or [None])[0]}
                for s in docs[:2]
            ]
        out[name] = entry
    return out
