"""One search session: the fitness set, the evolution, ``search.jsonl``, and the clocks over sessions.

:func:`ctxext.search.run.run_search` starts a :class:`SearchSession`, runs the evolution with its
callbacks (:meth:`~SearchSession.evaluate`, :meth:`~SearchSession.on_generation`) and takes the
:class:`~ctxext.search.settings.SearchResult` from :meth:`~SearchSession.finish`. A resumed session replays
the logged candidates first.
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

from ctxext.errors import InputError
from ctxext.progress import progress
from ctxext.search.evolution import Candidate, Evolution, EvolutionSettings, StopSearch, best
from ctxext.search.log import SearchLog, check_resume, model_fingerprint, read_log
from ctxext.search.settings import SEARCH_KIND, SearchResult, SearchSettings
from ctxext.tasks.forms import describe


@dataclass
class SearchSession:
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
    ) -> SearchSession:
        """Build the fitness set, the seeds and the evolution; open (or check and reopen) the log."""
        from ctxext.search.factors import seeds as make_seeds
        from ctxext.search.forms import usable_templates
        from ctxext.search.objective import build_objective

        # The clocks start here: the attention-factor scan (when searched) counts as search time.
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        header_settings = settings.logged(state.original_length, state.rotary_dim)
        fingerprint = model_fingerprint(switch.model)
        records = read_log(log_path) if settings.resume else [{}]
        if settings.resume:
            check_resume(records[0], header_settings, fingerprint, log_path)
        logged = [r for r in records if r.get("type") == "candidate"]
        forms, clock = _needle_forms(settings, switch, tokenizer, state, log, records[0])
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
        logged_limit = records[0].get("attention_limit")  # a resumed search's, read back as it was measured
        limit = _attention_limit(settings, switch, tokenizer, state, seeds[0].factors, log, logged_limit)
        evo_settings = EvolutionSettings(
            population=settings.population,
            generations=settings.generations,
            mutation_rate=settings.mutation_rate,
            step=settings.step,
            seed=settings.seed,
        )
        _announce_candidates(settings, objective, evo_settings.expected_evaluations(len(seeds)), clock, log)
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

    def _nothing_scored(self, evaluated: list[Candidate], seconds: float) -> str:
        # No winner to write: a budget spent before the first candidate (loading and calibration took it), or an
        # objective that came out NaN / infinite for every candidate.
        if not evaluated:
            return (
                f"the search budget ({self.settings.budget_seconds:g} s) was spent before the first candidate was "
                f"scored ({seconds:.0f} s went to loading the model and its data). Raise it (`ctxext search --budget "
                f"10m`, or search.budget in a recipe); the log in {self.search_log.path} is kept, so the same command "
                "with the larger budget continues it (with --resume for ctxext search)."
            )
        return (
            f"all {len(evaluated)} candidates scored NaN or infinity on the {self.settings.objective} objective, so "
            "none can be chosen; check the model and its data (or try `ctxext search --objective far-ppl`)."
        )

    def finish(self, evaluated: list[Candidate], ended: str) -> SearchResult:
        """Log the end of the search and return its result (without a report)."""
        seconds, cpu_seconds = self.wall(), self.cpu()
        if not any(c.score is not None and np.isfinite(c.score) for c in evaluated):
            raise InputError(self._nothing_scored(evaluated, seconds))
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


# The share of --budget the form check may take: it decides which forms the search asks, not the factors.
FORM_CHECK_SHARE = 0.25


def form_check_probes(settings: SearchSettings, forms: int, window: int, clock: Any) -> tuple[int, float]:
    """Probes per depth of the form check and its estimated seconds.

    :data:`~ctxext.tasks.forms.PROBES_PER_DEPTH`, fewer (at least one) where that would take more than
    :data:`FORM_CHECK_SHARE` of the budget.
    """
    from ctxext.search.objective import SEARCH_DEPTHS
    from ctxext.tasks.forms import PROBES_PER_DEPTH

    one = clock.seconds_at(window, 8) * forms * len(SEARCH_DEPTHS)  # one probe per depth of every form
    per_depth = max(1, min(PROBES_PER_DEPTH, int(FORM_CHECK_SHARE * settings.budget_seconds / one)))
    return per_depth, per_depth * one


def _needle_forms(
    settings: SearchSettings, switch: Any, tokenizer: Any, state: Any, log: Callable, header: dict[str, Any]
) -> tuple[Any, Any]:
    """Each training form probed inside the window with the base (None for far-ppl), and the base's forward clock.

    The clock (one short forward timed on the base) lets the search say what it costs before it runs: a real model
    at 8k tokens and more takes hours on a CPU. ``header``: a resumed search's log header, whose form check's probe
    count is used again (the clock may say otherwise today; the kept forms must not change).
    """
    from ctxext.models.cost import ForwardClock

    switch.restore()
    clock = ForwardClock.measure(switch.model, min(256, state.original_length))
    if settings.objective == "far-ppl":
        return None, clock
    from ctxext.progress import duration
    from ctxext.search.forms import check_forms
    from ctxext.search.objective import SEARCH_DEPTHS
    from ctxext.tasks import get_task
    from ctxext.tasks.forms import PROBES_PER_DEPTH, summarize

    templates = get_task("needle").training_templates()
    window = state.original_length
    per_depth, seconds = form_check_probes(settings, len(templates), window, clock)
    logged = max((f.get("planned") or f["probes"] for f in header.get("objective_set", {}).get("forms", [])), default=0)
    if logged:
        seconds, per_depth = seconds / per_depth * (logged // len(SEARCH_DEPTHS)), logged // len(SEARCH_DEPTHS)
    fewer = ""
    if per_depth < PROBES_PER_DEPTH:
        fewer = f" (not {PROBES_PER_DEPTH}: the check keeps to a quarter of --budget {settings.budget})"
    log(
        f"checking which needle forms the base retrieves inside its {window:,}-token window: {len(templates)} forms "
        f"× {len(SEARCH_DEPTHS)} depths × {per_depth} probe(s){fewer}, at most about {duration(seconds)} (a form's "
        f"check ends once its answer is certain; {clock.note()})"
    )
    checks = check_forms(
        switch.model,
        tokenizer,
        settings.data,
        window,
        templates,
        settings.seed,
        per_depth=per_depth,
        min_accuracy=settings.min_form_accuracy_fraction,
    )
    log(
        f"needle forms retrieved by the base inside its {state.original_length}-token window ({summarize(checks)}); "
        f"the search uses {', '.join(str(c.template) for c in checks if c.kept) or 'none'}"
    )
    return checks, clock


def _announce_candidates(settings: SearchSettings, objective: Any, total: int, clock: Any, log: Callable) -> None:
    """One line: what a candidate costs, how many the search runs, and whether the budget allows even one."""
    from ctxext.progress import duration

    n, length, budget = len(objective.sequences), settings.target_length, settings.budget_seconds
    each = n * clock.seconds_at(length, 8)
    line = (
        f"each candidate scores {n} sequence(s) of {length:,} tokens, about {duration(each)}; {total} candidates "
        f"(about {duration(total * each)}) or as many as --budget {settings.budget} allows"
    )
    if each > budget:
        line += ": not even one, raise --budget"
    log(line)


def _attention_limit(
    settings: SearchSettings,
    switch: Any,
    tokenizer: Any,
    state: Any,
    any_factors: np.ndarray,
    log: Callable,
    logged: dict[str, Any] | None = None,
) -> Any:
    """For ``--attention-factor search``: the range of the attention gene (None when the factor is fixed).

    ``logged`` is the range a resumed search's log holds: with the same settings, weights and data (checked
    before), a new scan would measure the same windows again, so it is taken as it is.
    """
    if not settings.searches_attention():
        return None
    from ctxext.search.apply import resolve_attention_factor
    from ctxext.search.attention import AttentionLimit, attention_limit

    if logged is not None:
        limit = AttentionLimit(**logged)
        log(f"attention factor searched in [1, {limit.high:.4g}], as logged")
        return limit

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
        try:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
            tmp.replace(log_path)
        finally:
            tmp.unlink(missing_ok=True)  # a full disk's empty temporary file is not left beside the log
        return
    from ctxext.atomic import write_manifest

    if settings.out.exists():
        shutil.rmtree(settings.out)  # empty, or a search folder ctxext wrote with --overwrite: checked before
    settings.out.mkdir(parents=True)
    SearchLog(log_path).append(header)
    write_manifest(settings.out, SEARCH_KIND)
