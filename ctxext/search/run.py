"""``ctxext search``: find per-dimension RoPE long factors for one model and one target length, training-free.

The workflow, top to bottom:

1. check the inputs (a RoPE model, a target above its context, a positive budget, the output folder)
   before anything is written;
2. load the model once (fp32 on the CPU) and build the fitness set on the training split; with
   ``--attention-factor search``, bound the attention factor by its in-window cost
   (:mod:`ctxext.scoring.windows`);
3. run the evolutionary search (:mod:`ctxext.search.evolution`) from the seeds of
   :mod:`ctxext.search.factors`, each candidate applied in place (:class:`~ctxext.search.apply.RopeSwitch`)
   and scored teacher-forced (:mod:`ctxext.search.objective`), logging every candidate to
   ``OUT/search.jsonl`` until the generations are done or the time budget is spent;
4. compare the best factors with the named methods on held-out files (:mod:`ctxext.search.report`);
5. write ``OUT`` as a model folder (``rope_type: longrope``, short factors 1, the found long factors)
   through :func:`ctxext.models.folder.extend_folder` in a temporary folder, reload it with plain transformers
   and check its runtime RoPE, then rename it into place — with the log, the factors and the report.

While the search runs, ``OUT`` holds only ``search.jsonl`` (no ``config.json``: it does not load as a
model); ``--resume`` continues from it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ctxext.errors import CtxextError, InputError
from ctxext.search.evolution import Candidate, run_evolution
from ctxext.search.log import LOG_NAME
from ctxext.search.session import SearchSession
from ctxext.search.settings import SEARCH_KIND, SearchResult, SearchSettings


def _prepare_out(settings: SearchSettings) -> Path:
    from ctxext.atomic import check_output, read_manifest

    out, log_path = settings.out, settings.out / LOG_NAME
    if settings.resume:
        if not log_path.is_file():
            raise InputError(f"nothing to resume: {log_path} does not exist (run without --resume to start a search)")
        manifest = read_manifest(out)
        if manifest is None or manifest.get("kind") != SEARCH_KIND:
            raise InputError(f"{out} was not written by ctxext search (no search manifest); nothing to resume")
        if (out / "config.json").exists():
            raise InputError(f"the search in {out} is complete (it holds a model); nothing to resume")
    elif out.exists() and any(out.iterdir()) and not settings.overwrite:
        raise FileExistsError(
            f"{out} already exists; pass --resume to continue its search or --overwrite to replace it"
        )
    else:
        # Replaces only a search folder ctxext wrote, and only with --overwrite (never a model or a run).
        check_output(out, SEARCH_KIND, settings.overwrite)
    return log_path


def run_search(
    settings: SearchSettings,
    log: Callable[[str], None] = print,
    on_candidate: Callable[[Candidate], None] | None = None,
) -> SearchResult:
    """Search long factors for a model and write the extended model folder with its report.

    Args:
        settings: what to search.
        log: receives progress lines.
        on_candidate: called after each newly evaluated candidate (tests use it to interrupt a search).

    Returns:
        The :class:`SearchResult`.

    Raises:
        InputError: bad settings, a log that belongs to another search, or another process writing ``out``.
        FileExistsError: ``out`` exists without ``--resume`` / ``--overwrite``.
        ctxext.rope.types.RopeError: a model without RoPE, or a target not above its context.
    """
    from ctxext.artifacts.lock import folder_lock

    # One search per folder: its log is appended to during the search, so the lock covers all of it.
    with folder_lock(settings.out):
        try:
            return _search(settings, log, on_candidate)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (ctxext.errors.Terminated)
            log_path = settings.out / LOG_NAME
            if not log_path.is_file():
                raise
            how = "interrupted" if getattr(exc, "exit_code", 130) == 130 else f"stopped by {exc}"
            raise CtxextError(
                f"search {how}; every candidate scored so far is in {log_path}. Run the same command again to "
                "continue from it (with --resume for ctxext search; ctxext train resumes its recipe's search itself).",
                exit_code=getattr(exc, "exit_code", 130),
            ) from None
        except Exception as exc:  # a full disk: the log written so far stays, to resume from
            from ctxext.errors import is_disk_full

            if not is_disk_full(exc, settings.out.parent):
                raise
            raise InputError(_disk_full_message(settings, exc)) from None


def _disk_full_message(settings: SearchSettings, exc: BaseException) -> str:
    """What to do after the disk filled up during a search: resume from its log, or (no log yet) run it again."""
    from ctxext.atomic import OUTPUT_MARKER, read_manifest
    from ctxext.errors import disk_full_message
    from ctxext.search.log import read_log

    out, log_path = settings.out, settings.out / LOG_NAME
    manifest = read_manifest(out)
    try:
        scored = sum(r.get("type") == "candidate" for r in read_log(log_path))
    except (OSError, InputError):  # no log, or not even its header line fitted
        scored = None
    if scored is None or manifest is None or manifest.get("kind") != SEARCH_KIND:  # nothing --resume accepts
        if not settings.resume and out.is_dir() and {p.name for p in out.iterdir()} <= {LOG_NAME, OUTPUT_MARKER}:
            shutil.rmtree(out)  # this search created the folder (_open_log) and nothing in it can be resumed
        return disk_full_message("--out", out, exc)
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "no space left on device"
    return (
        f"--out {out}: the disk filled up during the search ({reason}); the {scored} candidate(s) scored so far "
        f"are in {log_path}. Free some space, then run the same command again to continue from it (with --resume "
        "for ctxext search; ctxext train resumes its recipe's search itself)."
    )


def _search(
    settings: SearchSettings, log: Callable[[str], None], on_candidate: Callable[[Candidate], None] | None
) -> SearchResult:
    """:func:`run_search` with the output folder's lock held."""
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.models.sources import load_config
    from ctxext.rope.plan import describe_extension, plan_extension
    from ctxext.rope.read import read_rope
    from ctxext.search.apply import RopeSwitch, longrope_options

    settings.validate_run()
    # Everything that can be checked from the config is checked before a weight is loaded or a file written.
    config, _ = load_config(settings.model)
    state = read_rope(config, original_length=settings.original_length)
    existing = describe_extension(state)
    if existing:  # plan_extension's advice (--relative-to) is extend's; search has no such choice
        raise InputError(
            f"{settings.model}: this model is {existing}. ctxext search finds long factors for an unscaled base "
            "model; search the model it was extended from instead."
        )
    plan_extension(config, "linear", settings.target_length, None, settings.original_length)
    log_path = _prepare_out(settings)

    loaded = load_model(ModelSpec(settings.model), device=settings.device)
    switch = RopeSwitch(loaded.model, settings.original_length)
    session = SearchSession.start(settings, switch, loaded.tokenizer, state, log_path, log)
    if session.logged:
        log(f"resuming {log_path}: replaying {len(session.logged)} logged candidates")
        session.check_logged_best()
    with session.progress as session.tracker:
        score = lambda cand: session.evaluate(cand, on_candidate)  # noqa: E731
        evaluated, ended = run_evolution(session.evolution, session.seed_vectors(), score, session.on_generation)
    result = session.finish(evaluated, ended)
    if settings.report:
        from ctxext.search.report import compare_heldout

        log("comparing with the named methods on held-out files")
        result.report = compare_heldout(
            switch,
            loaded.tokenizer,
            np.asarray(result.long_factor),
            settings.target_length,
            objective=settings.objective,
            trials=settings.report_trials,
            docs=settings.report_docs,
            attention_factor=result.attention_factor,
            templates=session.objective.info.get("templates"),
            window_docs=settings.window_docs,
            show_progress=settings.show_progress,
        )
        if session.attention_limit is not None:
            result.report["attention_limit"] = asdict(session.attention_limit)
    switch.restore()
    options = longrope_options(result.long_factor, result.attention_factor)
    result.out = _write_output(settings, result, state, options, log_path)
    return result


def _write_output(
    settings: SearchSettings, result: SearchResult, state: Any, options: dict[str, Any], log_path: Path
) -> Path:
    """Write the model folder (with log, factors and report) atomically, after reloading and verifying it."""
    from ctxext.atomic import atomic_folder
    from ctxext.models.folder import extend_folder

    out = settings.out
    # The folder holds this search's log (its manifest says so): replaced by the finished folder.
    with atomic_folder(out, kind=SEARCH_KIND, overwrite=True) as tmp:
        plan = extend_folder(
            settings.model,
            tmp,
            "longrope",
            settings.target_length,
            options=options,
            original_length=settings.original_length,
            overwrite=True,
        )
        _verify_folder(tmp, options["long_factor"])
        shutil.copy2(log_path, tmp / LOG_NAME)
        (tmp / "factors.json").write_text(
            json.dumps({"short_factor": options["short_factor"], "long_factor": options["long_factor"]}, indent=2)
            + "\n"
        )
        summary = {k: v for k, v in asdict(result).items() if k not in ("out", "report")}
        summary["settings"] = settings.logged(state.original_length, state.rotary_dim)
        summary["rope_parameters"] = plan.rope_parameters
        (tmp / "search.json").write_text(json.dumps(summary, indent=2) + "\n")
        if result.report:
            from ctxext.search.report import write_report

            write_report(result.report, tmp, summary)
    return out


def _verify_folder(folder: Path, long_factor: list[float]) -> None:
    """Reload a written folder with plain transformers and check its runtime RoPE and its long factors."""
    from ctxext.models.build import load_weights
    from ctxext.models.sources import config_from_folder
    from ctxext.rope.runtime import verify_model_rope
    from ctxext.rope.types import RopeMismatchError

    model = load_weights(folder, config_from_folder(folder))
    verify_model_rope(model)
    params = model.config.rope_parameters
    if params.get("rope_type") != "longrope" or list(params.get("long_factor") or []) != list(long_factor):
        raise RopeMismatchError(f"{folder}: the reloaded config does not carry the searched long factors")
