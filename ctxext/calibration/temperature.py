"""``ctxext calibrate``: choose a fine-tuned run's attention temperature on held-out text, or keep 1.

A fine-tune extended to several times its window can be less sharp far into the target than it should be:
on the grown Mistral every miss left at the target sat right before the question and was a miscopied digit
token, and multiplying the attention logits by 1.2 after the fine-tune recovered most of them; training
with a temperature does not keep it, the fine-tune settles back (docs/results-training.md). The gain is not
universal and it costs perplexity where the context is short, so it is *measured per run*, not assumed:

1. For each candidate ``t``, on the same trials and windows: key retrieval (teacher-forced needle trials)
   at the target length over depths 0–100 and inside the original window, and the perplexity of held-out
   windows of the original length.
2. A ``t`` is *admissible* under the rule ``ctxext search`` applies to its attention factor
   (:func:`ctxext.scoring.windows.admissible`), against the run as trained on the same windows: its
   in-window perplexity is not detectably higher (the paired 95 % interval reaches down to 1) or
   demonstrably within ``window_tolerance`` percent (2 % by default: the upper end of the interval), and
   its in-window retrieval is not worse (exact McNemar, one-sided, ``alpha``). The reference is the run,
   not the base: the temperature's own cost is what is decided here (the base's held-out text may be its
   pretraining text, which would charge the fine-tune's forgetting to every ``t``).
3. The admissible ``t`` with the most correct trials at the target is chosen if it beats ``t`` = 1 there
   (exact McNemar, Holm-adjusted over the candidates, ``p < alpha``); otherwise the run keeps ``t`` = 1.

The cost is ``len(temperatures) × len(depths) × trials`` teacher-forced passes at the target length
(750 by default) and the short in-window ones.

The text is held out from the run's training: by default its recipe's validation documents (the split
its ``val_loss`` reads), with trials seeded apart from ``ctxext eval``'s, so choosing ``t`` does not
look at what the evaluation reports. The choice is written to ``RUN/calibration.json``; loading the run
(``ctxext eval``, ``ctxext merge`` …) then applies it, and ``ctxext merge`` folds it into the query
projection (:mod:`ctxext.models.temperature`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.errors import InputError
from ctxext.models.temperature import CALIBRATION_FILE, adapter_digest, set_attention_temperature, weights_stat
from ctxext.recipe.calibration import CalibrationSettings

_Log = Callable[[str], None]
# Given the run's tokenizer: the held-out texts and the words that name them in the record.
HeldOut = Callable[[Any], tuple[Iterable[str], str]]


@dataclass
class _Material:
    """What every candidate is measured on: needle trials at the target and in the window, held-out windows."""

    far: list[Any]
    near: list[Any]
    windows: list[list[int]]
    source: str


@dataclass
class _Measured:
    """One candidate's outcomes: per-trial retrieval at the target and in the window, per-window token NLLs."""

    t: float
    far: list[bool]
    near: list[bool]
    nll: np.ndarray


def calibrate_run(
    run_dir: str | Path,
    settings: CalibrationSettings,
    held_out: HeldOut,
    device: str | None = None,
    overwrite: bool = False,
    log: _Log = print,
    budget: tuple[float, str] | None = None,
) -> dict[str, Any] | None:
    """Measure each candidate temperature on held-out text and record the choice in ``RUN/calibration.json``.

    Args:
        run_dir: a run folder written by ``ctxext train``.
        settings: the candidates, trials and the choice's thresholds.
        held_out: given the run's tokenizer, the held-out texts to measure on and their description (the
            command passes ``--data``, or the run recipe's validation documents).
        device: ``cpu`` / ``cuda`` (default: cuda when available).
        overwrite: replace an earlier ``calibration.json``.
        log: where progress lines go.
        budget: the most seconds the measurements may take and the words that say where that limit comes from
            (``ctxext train``'s ``calibrate.when: auto``); an estimate above it measures nothing and writes nothing.

    Returns:
        The record written (``attention_temperature``, the measurements per candidate, the reason), or ``None``
        when the estimate is over ``budget``.

    Raises:
        InputError: not a finished run, an earlier calibration without ``overwrite``, a run without a target
            length, too little held-out text.
    """
    from ctxext.artifacts.lock import folder_lock
    from ctxext.artifacts.run import read_run
    from ctxext.atomic import check_writable, write_json_atomic

    started = time.time()
    run_dir = Path(run_dir)
    run = read_run(run_dir, force_flag=None)
    out = run_dir / CALIBRATION_FILE
    if out.exists() and not overwrite:
        raise InputError(f"{out}: the run is calibrated already; pass --overwrite to measure and choose again")
    target, window = run.target_length or 0, run.original_length or 0
    if not window or target <= window:
        raise InputError(f"{run_dir}: run.json names no target length beyond the original window; nothing to calibrate")
    check_writable(run_dir, "RUN", f"calibrate writes {CALIBRATION_FILE} there: make the run folder writable")
    # One writer per run folder, as train holds it: a second calibrate (or a train resuming there) is refused.
    with folder_lock(run_dir, flag="RUN"):
        if out.exists() and not overwrite:  # another calibrate finished while this one started
            raise InputError(f"{out}: the run is calibrated already; pass --overwrite to measure and choose again")
        record = _measure_and_choose(run_dir, settings, held_out, device, target, window, log, budget)
        if record is None:
            return None
        record["seconds"] = round(time.time() - started, 1)
        write_json_atomic(out, record)
    log(f"chose attention temperature {record['attention_temperature']:g}: {record['reason']}")
    return record


def _measure_and_choose(
    run_dir: Path,
    settings: CalibrationSettings,
    held_out: HeldOut,
    device: str | None,
    target: int,
    window: int,
    log: _Log,
    budget: tuple[float, str] | None = None,
) -> dict[str, Any] | None:
    """Measure every candidate on the same material and choose.

    Returns:
        The record without its timing, or ``None`` when the estimate is over ``budget`` (nothing measured).
    """
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.progress import duration
    from ctxext.scoring.windows import doc_nll

    loaded = load_model(ModelSpec(str(run_dir)), device=device, calibrated=False)
    seconds, estimate = _estimate(loaded.model, settings, target, window)
    n_far, n_near = len(settings.depths) * settings.trials, len(settings.depths) * settings.window_trials
    work = (
        f"{len(settings.temperatures)} temperatures × ({n_far} needle trials at {target} tokens + {n_near} at {window} "
        f"+ {settings.windows} windows of {window})"
    )
    if budget is not None and seconds > budget[0]:  # decided before any held-out text is read
        log(f"not calibrating {run_dir}: {work} would take about {duration(seconds)}, more than {budget[1]}")
        return None
    material = _material(loaded.tokenizer, held_out, settings, target, window)
    log(f"calibrating {run_dir}: {work}, held-out text: {material.source}; {estimate}")
    measured = []
    for t in settings.temperatures:
        set_attention_temperature(loaded.model, t)
        with torch.no_grad():
            # At a long target the far trials are most of the work: a progress line every 30 s without a terminal.
            far, near = _retrieval(loaded.model, material.far, show=True), _retrieval(loaded.model, material.near)
            measured.append(_Measured(t, far, near, doc_nll(loaded.model, material.windows)))
        ppl = math.exp(measured[-1].nll.mean())
        log(
            f"  t = {t:g}: {sum(far)}/{len(far)} at {target} tokens, {sum(near)}/{len(near)} at {window}, "
            f"ppl@{window} {ppl:.3f}"
        )
    set_attention_temperature(loaded.model, 1.0)
    rows = _candidates(measured, settings)
    chosen, reason = _choose(rows, settings)
    return {
        "attention_temperature": chosen,
        "reason": reason,
        "target_length": target,
        "original_length": window,
        "held_out": material.source,
        "adapter": adapter_digest(run_dir),
        "weights_stat": weights_stat(run_dir),
        "settings": settings.model_dump(),
        "candidates": rows,
    }


def _material(tokenizer: Any, held_out: HeldOut, settings: CalibrationSettings, target: int, window: int) -> _Material:
    """The needle trials at the target and in the window and the in-window windows, from held-out text."""
    from ctxext.tasks import HAYSTACK_MIN_TOKENS, Haystack
    from ctxext.tasks.samples import make_samples

    texts, source = held_out(tokenizer)
    # A haystack far longer than one trial (as a task source's in training; at least 8 target lengths), so
    # trials draw their filler from different text.
    haystack = Haystack.from_texts(tokenizer, texts, max(HAYSTACK_MIN_TOKENS, 8 * target), source)
    if len(haystack.ids) < 2 * target:
        raise InputError(
            f"{source}: {len(haystack.ids)} tokens of held-out text, fewer than twice the target length ({target}); "
            "name more held-out text with --data"
        )
    # Consecutive windows of the original length; the haystack separates documents with a blank line only.
    ids = haystack.ids
    windows = [list(ids[i : i + window]) for i in range(0, len(ids) - window + 1, window)][: settings.windows]
    if len(windows) < settings.windows:
        raise InputError(
            f"{source}: {len(windows)} windows of {window} tokens, fewer than --windows {settings.windows}; "
            "lower --windows or name more held-out text with --data"
        )

    def samples(length: int, trials: int) -> list[Any]:
        return [
            s
            for d in settings.depths
            for s in make_samples(tokenizer, "needle", haystack, length, d, trials=trials, seed=settings.seed)
        ]

    return _Material(samples(target, settings.trials), samples(window, settings.window_trials), windows, source)


def _estimate(model: Any, settings: CalibrationSettings, target: int, window: int) -> tuple[float, str]:
    """About how long the measurements take, from one short forward.

    Returns:
        The seconds, and a line with them and the flags that change them.
    """
    from ctxext.models.cost import ForwardClock
    from ctxext.progress import duration

    clock = ForwardClock.measure(model, min(256, window))
    trials = len(settings.depths) * settings.trials
    window_trials = len(settings.depths) * settings.window_trials
    one = (
        trials * clock.seconds_at(target, 8)
        + window_trials * clock.seconds_at(window, 8)
        + settings.windows * clock.seconds_at(window, window)
    )
    seconds = len(settings.temperatures) * one
    return seconds, (
        f"about {duration(seconds)} ({clock.note()}; --trials, --depths, --temperatures and --windows change it)"
    )


def _retrieval(model: Any, samples: list[Any], show: bool = False) -> list[bool]:
    from ctxext.scoring.answers import score_answers

    ids, spans = [x.ids for x in samples], [x.answer_span for x in samples]
    return [bool(s.correct) for s in score_answers(model, ids, spans, show_progress=show)]


def _candidates(measured: list[_Measured], settings: CalibrationSettings) -> list[dict[str, Any]]:
    """Each candidate against t = 1 on the same trials and windows: gains, in-window costs, verdicts."""
    from ctxext.scoring.stats import holm, mcnemar_exact
    from ctxext.scoring.windows import admissible, paired_window_ratio

    one = next(m for m in measured if m.t == 1.0)
    gains = [mcnemar_exact(m.far, one.far) for m in measured]
    # Several candidates are tested against t = 1: their p-values are Holm-adjusted together.
    others = [i for i, m in enumerate(measured) if m.t != 1.0]
    for i, p in zip(others, holm([float(gains[i]["p_value"]) for i in others]), strict=True):
        gains[i]["p_holm"] = p
    rows = []
    for m, gain in zip(measured, gains, strict=True):
        inside = mcnemar_exact(m.near, one.near)
        worse_inside = inside["only_b"] > inside["only_a"] and inside["p_value"] < 2 * settings.alpha  # one-sided
        cost = paired_window_ratio(m.nll, one.nll)
        rows.append(
            {
                "attention_temperature": m.t,
                "target_correct": sum(m.far),
                "target_trials": len(m.far),
                "target_by_depth": _by_depth(m.far, settings),
                "target_vs_1": gain,
                "window_correct": sum(m.near),
                "window_trials": len(m.near),
                "window_vs_1": inside,
                "window_ppl": float(math.exp(m.nll.mean())),
                "window_ppl_vs_1": {k: cost[k] for k in ("ratio", "ci_low", "ci_high", "documents")},
                "admissible": bool(admissible(cost, settings.window_tolerance / 100) and not worse_inside),
                "better": bool(gain["only_a"] > gain["only_b"] and gain.get("p_holm", 1.0) < settings.alpha),
            }
        )
    return rows


def _by_depth(outcomes: list[bool], settings: CalibrationSettings) -> dict[str, float]:
    n = settings.trials
    return {f"{d:g}": 100.0 * sum(outcomes[i * n : (i + 1) * n]) / n for i, d in enumerate(settings.depths)}


def _choose(rows: list[dict[str, Any]], settings: CalibrationSettings) -> tuple[float, str]:
    """The admissible temperature with the most correct target trials, if it beats t = 1 there; else 1."""
    one = next(r for r in rows if r["attention_temperature"] == 1.0)
    winners = [r for r in rows if r["admissible"] and r["better"]]
    if not winners:
        best = max(rows, key=lambda r: (r["target_correct"], -r["attention_temperature"]))
        if best["attention_temperature"] == 1.0:
            return 1.0, "no temperature retrieves more at the target length than the run as trained"
        if not best["better"]:
            return 1.0, (
                f"t = {best['attention_temperature']:g} retrieves {best['target_correct']} vs {one['target_correct']} "
                f"at the target, not a significant gain (Holm-adjusted p = {best['target_vs_1']['p_holm']:.2g} ≥ "
                f"{settings.alpha:g})"
            )
        return 1.0, "every temperature that retrieves significantly more costs more inside the window than allowed"
    best = max(winners, key=lambda r: (r["target_correct"], -r["attention_temperature"]))
    gain, cost = best["target_vs_1"], best["window_ppl_vs_1"]
    return float(best["attention_temperature"]), (
        f"{best['target_correct']} vs {one['target_correct']} of {best['target_trials']} at the target "
        f"(+{gain['only_a']}/−{gain['only_b']}, Holm-adjusted p = {gain['p_holm']:.2g}); in-window ppl × "
        f"{cost['ratio']:.4f} ({cost['ci_low']:.4f}–{cost['ci_high']:.4f}; "
        f"limit {1 + settings.window_tolerance / 100:g})"
    )
