"""``ctxext search``: find per-dimension RoPE long factors for one model and one target length, training-free.

The workflow, top to bottom:

1. check the inputs (a RoPE model, a target above its context, a positive budget, the output folder)
   before anything is written;
2. load the model once (fp32 on the CPU) and build the fitness set on the training split; with
   ``--attention-factor search``, bound the attention factor by its in-window cost
   (:mod:`ctxext.search.window`);
3. run the evolutionary search (:mod:`ctxext.search.evolution`) from the seeds of
   :mod:`ctxext.search.factors`, each candidate applied in place (:class:`~ctxext.search.apply.RopeSwitch`)
   and scored teacher-forced (:mod:`ctxext.search.objective`), logging every candidate to
   ``OUT/search.jsonl`` until the generations are done or the time budget is spent;
4. compare the best factors with the named methods on held-out files (:mod:`ctxext.search.report`);
5. write ``OUT`` as a model folder (``rope_type: longrope``, short factors 1, the found long factors)
   through :func:`ctxext.extend.folder.extend_folder` in a temporary folder, reload it with plain transformers
   and check its runtime RoPE, then rename it into place — with the log, the factors and the report.

While the search runs, ``OUT`` holds only ``search.jsonl`` (no ``config.json``: it does not load as a
model); ``--resume`` continues from it.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from ctxext.errors import CtxextError, InputError
from ctxext.progress import progress
from ctxext.recipe.search import SearchOptions
from ctxext.search.evolution import Candidate, Evolution, EvolutionSettings, StopSearch, best, run_evolution
from ctxext.search.log import LOG_NAME, SearchLog, check_resume, model_fingerprint, read_log


class SearchSettings(SearchOptions):
    """What to search and how: the declared :class:`~ctxext.recipe.search.SearchOptions` and this run's names.

    Every search default is declared in ``SearchOptions``; these fields name the run.

    Attributes:
        model: model folder, Hub id or ``builtin:NAME``.
        target_length: the context to extend to.
        out: output folder (the model folder, with the log and the report).
        original_length: overrides the pretraining length.
        device: ``cpu`` / ``cuda`` (default: CUDA when available).
        resume: continue the search logged in ``out``.
        overwrite: replace an existing ``out``.
        show_progress: draw a progress bar.
    """

    model: str
    target_length: int = Field(gt=0)
    out: Path
    original_length: int | None = Field(default=None, gt=0)
    device: str | None = None
    resume: bool = False
    overwrite: bool = False
    show_progress: bool = True

    def validate_run(self) -> None:
        """Raise :class:`InputError` for settings that cannot run together (each value is checked on assignment)."""
        from ctxext.search.objective import OBJECTIVES

        if self.objective not in OBJECTIVES:
            raise InputError(f"unknown objective {self.objective!r}; choose one of: {', '.join(OBJECTIVES)}")
        if self.resume and self.overwrite:
            raise InputError("--resume and --overwrite contradict each other: choose one")
        if self.report:
            from ctxext.search.report import check_fitness_data

            check_fitness_data(self.data)

    def logged(self, original_length: int, rotary_dim: int) -> dict[str, Any]:
        """The settings recorded in the log's header (everything that defines the search)."""
        from ctxext.search.apply import resolve_attention_factor

        attention: str | float = "search"
        if not self.searches_attention():
            attention = resolve_attention_factor(
                self.attention_factor, self.target_length / original_length, original_length
            )
        # Settings that only define some searches are recorded only for those.
        conditional: dict[str, Any] = {}
        if self.searches_attention():
            conditional |= {"window_tolerance": self.window_tolerance_fraction, "window_docs": self.window_docs}
        if self.objective != "far-ppl":
            conditional["min_form_accuracy"] = self.min_form_accuracy_fraction
        return {
            "model": self.model,
            "target_length": self.target_length,
            "original_length": original_length,
            "rotary_dim": rotary_dim,
            "objective": self.objective,
            "population": self.population,
            "generations": self.generations,
            "seed": self.seed,
            "samples": self.samples,
            "data": self.data,
            "mutation_rate": self.mutation_rate,
            "step": self.step,
            "attention_factor": attention,
            "budget_seconds": self.budget_seconds,
            **conditional,
        }


@dataclass
class SearchResult:
    """What a search found.

    Attributes:
        out: the written folder (None when nothing was written).
        long_factor: the best factors.
        score: their training-split objective.
        best_seed: the best seed (named method / grid point) and its score.
        evaluations: candidates evaluated (replayed ones included).
        ended: ``generations`` or ``budget``.
        seconds: search wall time over all sessions; ``cpu_seconds`` likewise in CPU time.
        attention_factor: the attention factor written (fixed, or the searched one).
        report: the held-out comparison (empty without a report).
    """

    out: Path | None
    long_factor: list[float]
    score: float
    best_seed: dict[str, Any]
    evaluations: int
    ended: str
    seconds: float
    cpu_seconds: float
    attention_factor: float = 1.0
    report: dict[str, Any] = field(default_factory=dict)


# The kind recorded in the output folder's manifest (ctxext.atomic): only a search folder ctxext wrote is
# resumed or replaced.
SEARCH_KIND = "search"


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
        ctxext.rope.core.RopeError: a model without RoPE, or a target not above its context.
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


def _search(
    settings: SearchSettings, log: Callable[[str], None], on_candidate: Callable[[Candidate], None] | None
) -> SearchResult:
    """:func:`run_search` with the output folder's lock held."""
    from ctxext.evaluation.loading import ModelSpec, load_model
    from ctxext.models.sources import load_config
    from ctxext.rope.core import describe_extension, plan_extension, read_rope
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
    session = _Session.start(settings, switch, loaded.tokenizer, state, log_path, log)
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


@dataclass
class _Session:
    """One search session: the fitness set, the evolution, the log, and the clocks (summed over sessions).

    Built by :meth:`start`; :meth:`evaluate` and :meth:`on_generation` are the evolution's callbacks.
    """

    settings: SearchSettings
    switch: Any
    objective: Any
    evolution: Evolution
    seeds: list[Any]
    search_log: SearchLog
    logged: list[dict[str, Any]]
    attention: float
    attention_limit: Any
    log: Callable[[str], None]
    progress: Any  # ctxext.progress.progress(...), entered by run_search
    n_generations_logged: int
    prior_wall: float = 0.0
    prior_cpu: float = 0.0
    start_wall: float = field(default_factory=time.perf_counter)
    start_cpu: float = field(default_factory=time.process_time)
    tracker: Any = None
    cache: dict[tuple[float, ...], float] = field(default_factory=dict)
    best_score: float = math.inf
    done: int = 0

    @classmethod
    def start(
        cls,
        settings: SearchSettings,
        switch: Any,
        tokenizer: Any,
        state: Any,
        log_path: Path,
        log: Callable[[str], None],
    ) -> _Session:
        """Build the fitness set, the seeds and the evolution; open (or check and reopen) the log."""
        from ctxext.search.factors import seeds as make_seeds
        from ctxext.search.forms import describe, usable_templates
        from ctxext.search.objective import build_objective

        # The clocks start here: the attention-factor scan (when searched) counts as search time.
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        header_settings = settings.logged(state.original_length, state.rotary_dim)
        fingerprint = model_fingerprint(switch.model)
        logged: list[dict[str, Any]] = []
        if settings.resume:
            records = read_log(log_path)
            check_resume(records[0], header_settings, fingerprint, log_path)
            logged = [r for r in records if r.get("type") == "candidate"]
        forms = _needle_forms(settings, switch, tokenizer, state, log)
        share = settings.min_form_accuracy_fraction
        templates = None if forms is None else usable_templates(forms, state.original_length, share)
        objective = build_objective(
            settings.objective,
            tokenizer,
            settings.target_length,
            state.original_length,
            settings.samples,
            settings.seed,
            settings.data,
            templates=templates,
        )
        if forms is not None:
            objective.info["forms"] = describe(forms)
        seeds = make_seeds(switch.model.config, settings.target_length, settings.original_length)
        upper = max(1.0 + settings.target_length / state.original_length, max(float(s.factors.max()) for s in seeds))
        limit = _attention_limit(settings, switch, tokenizer, state, seeds[0].factors, log)
        evo_settings = EvolutionSettings(
            population=settings.population,
            generations=settings.generations,
            mutation_rate=settings.mutation_rate,
            step=settings.step,
            seed=settings.seed,
        )
        attention_range = None if limit is None else (limit.low, limit.high)
        evolution = Evolution(evo_settings, lower=1.0, upper=upper, attention=attention_range)
        header = {
            "type": "header",
            "settings": header_settings,
            "fingerprint": fingerprint,
            "objective_set": objective.info,
            "seeds": [s.name for s in seeds],
            "bounds": [1.0, upper],
        }
        if limit is not None:
            header["attention_limit"] = asdict(limit)
        _open_log(settings, log_path, header)
        n_generations = sum(1 for r in read_log(log_path) if r.get("type") == "generation")
        return cls(
            settings=settings,
            switch=switch,
            objective=objective,
            evolution=evolution,
            seeds=seeds,
            search_log=SearchLog(log_path),
            logged=logged,
            attention=float(header_settings["attention_factor"]) if limit is None else limit.high,
            attention_limit=limit,
            log=log,
            progress=progress("search", evo_settings.expected_evaluations(len(seeds)), enabled=settings.show_progress),
            n_generations_logged=n_generations,
            prior_wall=float(logged[-1]["seconds"]) if logged else 0.0,
            prior_cpu=float(logged[-1]["cpu_seconds"]) if logged else 0.0,
            start_wall=start_wall,
            start_cpu=start_cpu,
        )

    def seed_vectors(self) -> list[tuple[str, np.ndarray]]:
        """The seeds as search vectors (with the attention gene at the top of its range when it is searched)."""
        if self.attention_limit is None:
            return [(s.name, s.factors) for s in self.seeds]
        return [(s.name, np.append(s.factors, self.attention_limit.high)) for s in self.seeds]

    def split(self, vector: np.ndarray) -> tuple[np.ndarray, float]:
        """``(long factors, attention factor)`` of a search vector."""
        n = self.evolution.n_factors(vector)
        return vector[:n], (float(vector[n]) if n < len(vector) else self.attention)

    def wall(self) -> float:
        """Search wall time over all sessions."""
        return self.prior_wall + time.perf_counter() - self.start_wall

    def cpu(self) -> float:
        """Search CPU time over all sessions."""
        return self.prior_cpu + time.process_time() - self.start_cpu

    def check_logged_best(self) -> None:
        """Score the logged candidate that would win again (:func:`ctxext.search.log.verify_logged_best`)."""
        from ctxext.search.log import verify_logged_best

        def rescore(factors: np.ndarray, attention: float) -> float:
            self.switch.use_factors(factors, self.settings.target_length, attention)
            return self.objective.fitness(self.objective.score(self.switch.model))

        verify_logged_best(self.logged, self.search_log.path, rescore, len(self.seeds[0].factors), self.attention)

    def _replayed(self, cand: Candidate) -> float:
        record = self.logged[cand.index]
        factors, attention = self.split(cand.factors)
        same = record["index"] == cand.index and np.array_equal(np.asarray(record["factors"]), factors)
        if not same or float(record.get("attention_factor", self.attention)) != attention:
            raise InputError(
                f"{self.search_log.path}: candidate {cand.index} of the log differs from the replay (was the log "
                "written by another ctxext version?); start afresh with --overwrite"
            )
        return float(record["score"])

    def _scored(self, cand: Candidate, key: tuple[float, ...]) -> float:
        if self.wall() >= self.settings.budget_seconds:
            raise StopSearch
        factors, attention = self.split(cand.factors)
        if key in self.cache:
            score = self.cache[key]
        else:
            self.switch.use_factors(factors, self.settings.target_length, attention)
            score = self.objective.fitness(self.objective.score(self.switch.model))
        self.search_log.append(
            {
                "type": "candidate",
                "index": cand.index,
                "generation": cand.generation,
                "origin": cand.origin,
                "factors": [float(v) for v in factors],
                "attention_factor": attention,
                "score": score,
                "seconds": round(self.wall(), 3),
                "cpu_seconds": round(self.cpu(), 3),
            }
        )
        return score

    def evaluate(self, cand: Candidate, on_candidate: Callable[[Candidate], None] | None = None) -> float:
        """The evolution's scoring callback: a logged score on replay, else one teacher-forced pass."""
        key = tuple(np.round(cand.factors, 12))
        replay = cand.index < len(self.logged)
        score = self._replayed(cand) if replay else self._scored(cand, key)
        self.cache[key] = score
        self.best_score = min(self.best_score, score)
        self.done += 1
        self.tracker.update(self.done, description=f"search gen {cand.generation} · best {self.best_score:.4f}")
        if on_candidate is not None and not replay:
            on_candidate(cand)
        return score

    def on_generation(self, generation: int, population: list[Candidate]) -> None:
        """Log a finished generation (once: a resumed search does not log a replayed one again)."""
        top = best(population)
        if generation >= self.n_generations_logged:
            self.search_log.append(
                {
                    "type": "generation",
                    "generation": generation,
                    "best_index": top.index,
                    "best_score": top.score,
                    "best_origin": top.origin,
                    "evaluations": self.done,
                    "seconds": round(self.wall(), 3),
                }
            )
        self.log(
            f"generation {generation}: best {top.score:.4f} ({top.origin}, candidate {top.index}), "
            f"{self.done} evaluations"
        )

    def finish(self, evaluated: list[Candidate], ended: str) -> SearchResult:
        """Log the end of the search and return its result (without a report)."""
        seconds, cpu_seconds = self.wall(), self.cpu()
        winner = best(evaluated)
        seed_cands = [c for c in evaluated if c.origin.startswith("seed:")]
        top_seed = best(seed_cands) if seed_cands else winner
        factors, attention = self.split(winner.factors)
        self.search_log.append(
            {
                "type": "end",
                "reason": ended,
                "evaluations": len(evaluated),
                "best_index": winner.index,
                "best_score": winner.score,
                "best_attention_factor": attention,
                "best_seed": top_seed.origin,
                "best_seed_score": top_seed.score,
                "seconds": round(seconds, 3),
                "cpu_seconds": round(cpu_seconds, 3),
            }
        )
        self.log(
            f"search ended ({ended}) after {len(evaluated)} evaluations, {seconds:.0f} s wall / {cpu_seconds:.0f} s "
            f"CPU: best {winner.score:.4f} ({winner.origin}, attention factor {attention:.4g}); best seed "
            f"{top_seed.origin} {top_seed.score:.4f}"
        )
        assert winner.score is not None  # every evaluated candidate has a score
        return SearchResult(
            out=None,
            long_factor=[float(v) for v in factors],
            score=float(winner.score),
            best_seed={"name": top_seed.origin.removeprefix("seed:"), "score": top_seed.score},
            evaluations=len(evaluated),
            ended=ended,
            seconds=seconds,
            cpu_seconds=cpu_seconds,
            attention_factor=attention,
        )


def _needle_forms(settings: SearchSettings, switch: Any, tokenizer: Any, state: Any, log: Callable) -> Any:
    """For a needle objective: each training form probed inside the window with the base (None for far-ppl)."""
    if settings.objective == "far-ppl":
        return None
    from ctxext.search.forms import check_forms, summarize
    from ctxext.tasks import get_task

    switch.restore()
    templates = get_task("needle").training_templates()
    checks = check_forms(
        switch.model,
        tokenizer,
        settings.data,
        state.original_length,
        templates,
        settings.seed,
        min_accuracy=settings.min_form_accuracy_fraction,
    )
    log(
        f"needle forms retrieved by the base inside its {state.original_length}-token window ({summarize(checks)}); "
        f"the search uses {', '.join(str(c.template) for c in checks if c.kept) or 'none'}"
    )
    return checks


def _attention_limit(
    settings: SearchSettings, switch: Any, tokenizer: Any, state: Any, any_factors: np.ndarray, log: Callable
) -> Any:
    """For ``--attention-factor search``: the range of the attention gene (None when the factor is fixed)."""
    if not settings.searches_attention():
        return None
    from ctxext.search.apply import resolve_attention_factor
    from ctxext.search.window import attention_limit

    ceiling = resolve_attention_factor("auto", settings.target_length / state.original_length, state.original_length)
    limit = attention_limit(
        switch,
        tokenizer,
        settings.data,
        settings.target_length,
        ceiling,
        settings.step,
        settings.window_tolerance_fraction,
        any_factors,
        settings.window_docs,
    )
    log(
        f"attention factor searched in [1, {limit.high:.4g}]: the largest on the grid up to {ceiling:.4g} whose "
        "in-window ppl ratio to the base (paired 95% CI, training-split windows) includes 1 or stays within "
        f"+{settings.window_tolerance:g}%"
    )
    return limit


def _open_log(settings: SearchSettings, log_path: Path, header: dict[str, Any]) -> None:
    """Start a fresh log (with the folder's manifest), or rewrite a resumed one without a cut-off last line."""
    if settings.resume:
        keep = read_log(log_path)
        tmp = log_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        tmp.replace(log_path)
        return
    from ctxext.atomic import write_manifest

    if settings.out.exists():
        shutil.rmtree(settings.out)  # empty, or a search folder ctxext wrote with --overwrite: checked before
    settings.out.mkdir(parents=True)
    SearchLog(log_path).append(header)
    write_manifest(settings.out, SEARCH_KIND)


def _write_output(
    settings: SearchSettings, result: SearchResult, state: Any, options: dict[str, Any], log_path: Path
) -> Path:
    """Write the model folder (with log, factors and report) atomically, after reloading and verifying it."""
    from ctxext.atomic import atomic_folder
    from ctxext.extend.folder import extend_folder

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
    import torch
    from transformers import AutoModelForCausalLM

    from ctxext.rope.core import RopeMismatchError, verify_model_rope

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    verify_model_rope(model)
    params = model.config.rope_parameters
    if params.get("rope_type") != "longrope" or list(params.get("long_factor") or []) != list(long_factor):
        raise RopeMismatchError(f"{folder}: the reloaded config does not carry the searched long factors")
