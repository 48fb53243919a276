"""The relative target: does an extended model use its longer window as well as its base used its own?

A fixed bar (say 90 % of keys at every depth) says little about a base that retrieves 60 % inside its own
window, and too little about one at 100 %. ctxext judges an extension against the base instead (the definition
the transfer experiments read, ``experiments/transfer/read.py``, and ``ctxext demo`` prints):

- **at the target length, at every depth**, key retrieval ≥ the lower of 90 % and the base's own in-window
  accuracy at that depth minus 3 points;
- **inside the original window**, retrieval (all depths together) no more than 3 points below the base's;
- **inside the original window**, perplexity no more than 3 % above the base's.

A depth *meets* its target when its rate reaches it and the Wilson 95 % lower bound is within 5 points of it; a
rate that reaches the target with a wider interval (too few trials to tell) is *short of trials*, not a miss. A
claim rests on ≥ 300 distinct prompts per depth over ≥ 3 training seeds; one demo run (50 prompts per depth, one
seed) is a reading on the way to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxext.scoring.stats import wilson_interval

# The absolute cap on a depth's target, and how far below the base the extension may fall.
GOAL, IN_WINDOW_SLACK = 0.90, 0.03
# How far below a depth's target the Wilson lower bound may reach (a rate that meets the target on few trials).
BOUND_SLACK = 0.05
# In-window perplexity, extension over base, at most.
PPL_SLACK = 1.03

MEETS, FEW, MISSES = "meets", "short of trials", "misses"


def depth_target(base_rate: float) -> float:
    """A depth's target at the extended length, from the base's in-window rate at that depth."""
    return min(GOAL, base_rate - IN_WINDOW_SLACK)


@dataclass(frozen=True)
class DepthReading:
    """One depth: the base inside its window, the extension at the target length."""

    depth: float
    base_correct: int
    base_trials: int
    correct: int
    trials: int

    @property
    def base_rate(self) -> float:
        """The base's in-window rate at this depth."""
        return self.base_correct / self.base_trials

    @property
    def target(self) -> float:
        """This depth's target (:func:`depth_target`)."""
        return depth_target(self.base_rate)

    @property
    def rate(self) -> float:
        """The extension's rate at the target length."""
        return self.correct / self.trials

    @property
    def interval(self) -> tuple[float, float]:
        """The extension's Wilson 95 % interval."""
        return wilson_interval(self.correct, self.trials)

    @property
    def state(self) -> str:
        """:data:`MEETS`, :data:`FEW` (the rate reaches the target, the interval is too wide) or :data:`MISSES`."""
        if self.rate < self.target:
            return MISSES
        return MEETS if self.interval[0] >= self.target - BOUND_SLACK else FEW


def read_depth(depth: float, base_outcomes: list[int], outcomes: list[int]) -> DepthReading:
    """A depth's reading from its trials' outcomes (1 = retrieved): the base's in its window, the extension's."""
    return DepthReading(depth, sum(base_outcomes), len(base_outcomes), sum(outcomes), len(outcomes))


def in_window_kept(rate: float, base_rate: float) -> bool:
    """Whether in-window retrieval stayed within :data:`IN_WINDOW_SLACK` of the base's."""
    return rate >= base_rate - IN_WINDOW_SLACK


def perplexity_kept(ratio: float) -> bool:
    """Whether in-window perplexity (extension / base) stayed within :data:`PPL_SLACK`."""
    return ratio <= PPL_SLACK


@dataclass(frozen=True)
class TargetReading:
    """A whole reading of one extension against its base (:func:`read_report`)."""

    model: str
    original: int
    target: int
    depths: list[DepthReading]
    in_window: tuple[int, int, int, int]  # extension correct, trials; base correct, trials
    ppl_ratio: tuple[float, float, float] | None  # ratio, CI low, CI high (None: no perplexity in the report)

    @property
    def in_window_ok(self) -> bool:
        """Whether in-window retrieval stayed within 3 points of the base's (:func:`in_window_kept`)."""
        correct, trials, base_correct, base_trials = self.in_window
        return in_window_kept(correct / trials, base_correct / base_trials)

    @property
    def state(self) -> str:
        """:data:`MISSES` if any part misses, else :data:`FEW` if any depth is short of trials, else :data:`MEETS`."""
        states = {d.state for d in self.depths}
        if MISSES in states or not self.in_window_ok or (self.ppl_ratio and not perplexity_kept(self.ppl_ratio[0])):
            return MISSES
        return FEW if FEW in states else MEETS


def _cells(model: dict[str, Any], length: int) -> dict[float, list[int]]:
    cells = (model.get("needle") or {}).get("cells") or []
    return {float(c["depth"]): list(c["outcomes"]) for c in cells if int(c["length"]) == length and c.get("outcomes")}


def read_report(report: dict[str, Any], model: str, base: str, original: int, target: int) -> TargetReading | None:
    """``model``'s reading against ``base`` from an evaluation report's needle grid and paired perplexity.

    Args:
        report: an evaluation report (``ctxext.eval.report/v1``) with both models' needle cells at ``original``
            and ``target`` on the same prompts.
        model: the extension's name in the report.
        base: the base's name (the report's reference for the perplexity ratio).
        original: the base's window.
        target: the extended length.

    Returns:
        The reading, or ``None`` when the report lacks the needle cells it needs.
    """
    models = {m["name"]: m for m in report.get("models", [])}
    if model not in models or base not in models:
        return None
    base_in, tuned_in = _cells(models[base], original), _cells(models[model], original)
    tuned_far = _cells(models[model], target)
    depths = sorted(set(base_in) & set(tuned_far))
    if not depths or set(base_in) != set(tuned_in):
        return None
    flat = [o for d in sorted(tuned_in) for o in tuned_in[d]]
    base_flat = [o for d in sorted(base_in) for o in base_in[d]]
    ratio = None
    comparisons = report.get("comparisons") or {}
    if comparisons.get("reference") == base:
        for row in comparisons.get("perplexity") or []:
            if row.get("model") == model and row.get("view") == "length" and row.get("length") == original:
                ratio = (float(row["ratio"]), float(row["ci_low"]), float(row["ci_high"]))
    return TargetReading(
        model=model,
        original=original,
        target=target,
        depths=[read_depth(d, base_in[d], tuned_far[d]) for d in depths],
        in_window=(sum(flat), len(flat), sum(base_flat), len(base_flat)),
        ppl_ratio=ratio,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


_MARK = {MEETS: "✓", FEW: "✓ on too few trials to tell", MISSES: "✗"}
_VERDICT = {
    MEETS: "meets it",
    FEW: "reaches it, on too few trials to say (raise needle.trials)",
    MISSES: "does not meet it",
}


def reading_lines(reading: TargetReading) -> list[str]:
    """The reading as plain lines: a heading, one line per depth, the in-window checks, the verdict."""
    lines = [
        f"relative target (docs/evaluation.md): {reading.model} at {reading.target} tokens against the base at "
        f"{reading.original}"
    ]
    for d in reading.depths:
        low, high = d.interval
        lines.append(
            f"  depth {d.depth:g} %: {_pct(d.rate)} % [{_pct(low)}–{_pct(high)}] of {d.trials}, target "
            f"{_pct(d.target)} (base {_pct(d.base_rate)} %) {_MARK[d.state]}"
        )
    correct, trials, base_correct, base_trials = reading.in_window
    lines.append(
        f"  in its window: {_pct(correct / trials)} % vs the base's {_pct(base_correct / base_trials)} %, at most "
        f"{_pct(IN_WINDOW_SLACK)} points below {_MARK[MEETS if reading.in_window_ok else MISSES]}"
    )
    if reading.ppl_ratio is not None:
        ratio, low, high = reading.ppl_ratio
        mark = _MARK[MEETS if perplexity_kept(ratio) else MISSES]
        lines.append(
            f"  perplexity at {reading.original}: ×{ratio:.3f} [{low:.3f}–{high:.3f}], at most ×{PPL_SLACK:g} {mark}"
        )
    verdict = _VERDICT[reading.state]
    per_depth = min(d.trials for d in reading.depths)
    lines.append(f"  → {verdict} ({per_depth} prompts per depth, one run: a claim needs ≥ 300 over 3 training seeds)")
    return lines


def report_readings(report: dict[str, Any]) -> list[TargetReading]:
    """Every extended model of a report against its reference, where the reference is the unextended base.

    The reference (the report's paired comparisons', else its first model) must run at its own window (no RoPE
    extension); each model extended from that window is read at its extended length. Models, lengths or needle
    cells that do not fit that shape are left out.
    """
    models = report.get("models") or []
    if not models:
        return []
    reference = (report.get("comparisons") or {}).get("reference") or models[0]["name"]
    base = next((m for m in models if m["name"] == reference), None)
    rope = (base or {}).get("rope") or {}
    original = rope.get("original_length")
    if not original or rope.get("current_length") != original:
        return []
    out = []
    for model in models:
        extended = model.get("rope") or {}
        target = extended.get("current_length")
        if model is base or extended.get("original_length") != original or not target or target <= original:
            continue
        reading = read_report(report, model["name"], reference, int(original), int(target))
        if reading is not None:
            out.append(reading)
    return out


def target_markdown(report: dict[str, Any]) -> list[str]:
    """``report.md``'s section: each extended model against the base's own window (empty when none reads)."""
    readings = report_readings(report)
    if not readings:
        return []
    reference = (report.get("comparisons") or {}).get("reference") or report["models"][0]["name"]
    lines = [
        f"## Relative target: each extension against `{reference}` in its own window",
        "",
        "At the extended length, every depth ≥ the lower of 90 % and the base's in-window accuracy there minus 3 "
        "points (met when the Wilson 95 % lower bound is within 5 points too); in the window, retrieval at most 3 "
        "points and perplexity at most 3 % off the base's. One evaluation is a reading: a claim rests on ≥ 300 "
        "prompts per depth over 3 training seeds (docs/evaluation.md).",
        "",
        "| model | length | "
        + " | ".join(f"depth {d.depth:g} %" for d in readings[0].depths)
        + " | in its window | ppl in window | verdict |",
        "| --- | --- | " + " | ".join("---" for _ in readings[0].depths) + " | --- | --- | --- |",
    ]
    for r in readings:
        cells = []
        for d in r.depths:
            low, high = d.interval
            cells.append(f"{_pct(d.rate)} [{_pct(low)}, {_pct(high)}] vs {_pct(d.target)} {_MARK[d.state]}")
        correct, trials, base_correct, base_trials = r.in_window
        kept = _MARK[MEETS if r.in_window_ok else MISSES]
        inside = f"{_pct(correct / trials)} vs {_pct(base_correct / base_trials)} {kept}"
        ppl = "-"
        if r.ppl_ratio is not None:
            ppl = f"×{r.ppl_ratio[0]:.3f} {_MARK[MEETS if perplexity_kept(r.ppl_ratio[0]) else MISSES]}"
        row = [r.model, str(r.target), *cells, inside, ppl, _VERDICT[r.state]]
        lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]
