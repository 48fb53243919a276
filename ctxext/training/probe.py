"""Adaptive stop (``train.probe``): train until a held-out retrieval probe at the target length says it is learned.

Every ``train.probe.interval`` optimizer steps (and at the last one) the run scores key retrieval at the probe
length, teacher-forced (:func:`ctxext.scoring.answers.score_answer_sets`) on key sets
(:func:`ctxext.tasks.keyset.make_keyset`: ``keys`` needles per input, one forward scores them all). The key sets are
built once, from the training data's held-out *validation* documents (never the evaluation's held-out files:
``ctxext validate`` refuses training corpora that read them) in the key forms training uses
(:meth:`ctxext.recipe.schema.Recipe.probe_forms`; the evaluation's held-out forms stay unseen), with prompts
drawn from ``train.seed``, so every probe of a run scores the same trials (the curve compares steps, not prompt
draws) and each training seed gets fresh ones. Each reading also counts the keys by form, and the probe's line shows
them.

Which forms (``train.probe.forms``): by default only those the base retrieves inside its own window, checked before
the first step with the model set back to its original RoPE
(:func:`ctxext.training.probe_inputs.check_window_forms`, the check ``ctxext search`` makes,
:mod:`ctxext.tasks.forms`). The skill a longer window must keep is the base's; a form the base never
retrieves is one the fine-tune teaches from nothing, and on the grown Mistral and GPT-NeoX bases such a form (the
comment form, 0 % in their windows) stayed at 27–53 % while the base's form was retrieved 97–100 % at 4×: a goal
over every form was out of reach and the run went on to ``train.max_steps``. ``trained`` asks in every form.

Which depths (``train.probe.depths``): by default the keys stand at the evaluation's five depths, 0, 25, 50, 75 and
100 % (the last right before the question), as many at each, and a reading is judged by its **worst depth**
(:func:`score_of`), as the target is every depth's. Judged on all keys together, the grown Mistral base's runs met a
95 % goal after 80–480 steps with depth 100 % at 88 % (the other depths 97–98 %): the pooled rate hid the one depth
that needed more training.

After each probe the main process decides, and every process applies its decision (so all stop at the same step):

* the score (the worst depth's rate; all keys' with ``depths: null``) reaches ``goal`` → stop (``goal``); with
  ``train.probe.rule: pooled``, all keys' rate reaches it and no depth is more than ``margin`` below it
  (:data:`GOAL_RULES`; the reading that stops the run is the adapter kept);
* a better score than every earlier probe → the trainable weights are kept as the best (in memory, and in every
  checkpoint); otherwise ``patience`` probes without a better score → stop (``plateau``);
* ``train.max_steps`` is the ceiling (``ceiling``: the goal was not reached, said in one line).

At the end the best weights are put back, so the adapter written is the best probe's. The state (the curve, the best
rate, its weights, the probes without improvement, the time spent) is checkpointed with the run, so a resumed run
stops at the step an uninterrupted one stops at. ``probe.json`` (the curve) and ``probe.png`` are written into the
run folder; ``run.json``'s ``probe`` says why the run stopped and what the probe cost as a share of the loop's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctxext.atomic import write_json_atomic
from ctxext.recipe.schema import Recipe
from ctxext.recipe.sections import PROBE_BATCH_TOKENS
from ctxext.training.probe_inputs import ProbeInputs

PROBE_FILE = "probe.json"
PROBE_PLOT = "probe.png"


@dataclass
class ProbeState:
    """Where the adaptive stop stands; checkpointed with the run (accelerate's custom state).

    Attributes:
        readings: one dict per probe (step, rate, correct, n, by_form, low, high, nll, seconds), in order.
        best_rate: the best score so far (:func:`score_of`: the worst depth's rate with a depth grid), ``None`` before
            the first probe.
        best_step: its step.
        since_best: probes since the best one.
        stopped: ``goal`` or ``plateau`` once the probe stopped the run.
        probe_seconds: wall time spent probing.
        loop_seconds: wall time of the training loop (probes included) up to the last mark.
        best_weights: the trainable weights at the best probe (CPU tensors by parameter name).
    """

    readings: list[dict[str, Any]] = field(default_factory=list)
    best_rate: float | None = None
    best_step: int | None = None
    since_best: int = 0
    stopped: str | None = None
    probe_seconds: float = 0.0
    loop_seconds: float = 0.0
    best_weights: dict[str, torch.Tensor] | None = None
    _mark: float | None = None

    def start_clock(self) -> None:
        """Count the loop's time from now (the loop's start, also after a resume)."""
        self._mark = time.perf_counter()

    def tick(self) -> None:
        """Add the time since the last mark to :attr:`loop_seconds`."""
        if self._mark is not None:
            now = time.perf_counter()
            self.loop_seconds += now - self._mark
            self._mark = now

    def state_dict(self) -> dict[str, Any]:
        """For accelerate's ``save_state``."""
        self.tick()
        return {
            "readings": list(self.readings),
            "best_rate": self.best_rate,
            "best_step": self.best_step,
            "since_best": self.since_best,
            "stopped": self.stopped,
            "probe_seconds": self.probe_seconds,
            "loop_seconds": self.loop_seconds,
            "best_weights": self.best_weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """For accelerate's ``load_state``."""
        self.readings = list(state["readings"])
        self.best_rate, self.best_step = state["best_rate"], state["best_step"]
        self.since_best, self.stopped = int(state["since_best"]), state["stopped"]
        self.probe_seconds, self.loop_seconds = float(state["probe_seconds"]), float(state["loop_seconds"])
        self.best_weights = state["best_weights"]

    @property
    def fraction(self) -> float | None:
        """The probe's share of the loop's wall time."""
        return self.probe_seconds / self.loop_seconds if self.loop_seconds > 0 else None


def score_of(reading: dict[str, Any]) -> float:
    """What a reading is judged by: its worst depth's rate with a depth grid (``train.probe.depths``), else its rate."""
    return float(reading.get("score", reading["rate"]))


@dataclass(frozen=True)
class GoalRule:
    """How a reading is judged (``train.probe.rule``).

    Attributes:
        met: whether a reading meets the goal: ``(reading, goal, margin) -> bool``.
        key: what "better" compares, first value first (the first is the best rate the lines show).
        judged: what that first value is, for the lines (``""``: all keys, said by nothing).
    """

    met: Callable[[dict[str, Any], float, float], bool]
    key: Callable[[dict[str, Any]], tuple[float, float]]
    judged: str


def _depth_rates(reading: dict[str, Any]) -> list[float]:
    return [c / n for c, n in (reading.get("by_depth") or {}).values()]


# worst: the worst depth meets the goal (the target is every depth's). pooled: all keys together meet it and no depth
# is more than ``margin`` below it; a replay of the transfer runs' probe curves (docs/training.md, "Adaptive stop")
# has it stop 38 % sooner, its adapters not yet evaluated: not the default.
GOAL_RULES: dict[str, GoalRule] = {
    "worst": GoalRule(
        met=lambda r, goal, margin: score_of(r) >= goal,
        key=lambda r: (score_of(r), r["rate"]),
        judged="(worst depth) ",
    ),
    "pooled": GoalRule(
        met=lambda r, goal, margin: r["rate"] >= goal and all(x >= goal - margin for x in _depth_rates(r)),
        key=lambda r: (r["rate"], score_of(r)),
        judged="",
    ),
}


def decide(
    state: ProbeState,
    reading: dict[str, Any],
    goal: float,
    patience: int | None,
    rule: str = "worst",
    margin: float = 0.05,
) -> tuple[str | None, bool]:
    """What a probe's reading means: ``(stop reason or None, whether it is the best so far)``.

    Better is a higher value of the rule's key: under ``worst`` a higher worst depth and, at an equal one (32 keys
    per depth move it in steps of 3 points, so ties are common), a higher rate over all keys; under ``pooled`` the
    other way round. A reading that meets the goal is the best.
    """
    judge = GOAL_RULES[rule]
    best = next((r for r in state.readings if r["step"] == state.best_step), None)
    if best is not None:
        improved = judge.key(reading) > judge.key(best)
    else:
        improved = state.best_rate is None or judge.key(reading)[0] > state.best_rate
    if judge.met(reading, goal, margin):
        # The reading that stops the run is the adapter it keeps (under `worst` it is the best already: every earlier
        # one read below the goal; under `pooled` an earlier one may have more keys with a depth below the floor).
        return "goal", True
    if not improved and patience is not None and state.since_best + 1 >= patience:
        return "plateau", improved
    return None, improved


class Probe:
    """The adaptive stop of one run: scores, decides (main process), keeps the best weights.

    Args:
        recipe: the recipe (``train.probe`` set).
        inputs: the probe's key sets (:func:`build_probe_inputs`).
        launch: the job (:class:`ctxext.training.launch.Launch`).
    """

    def __init__(self, recipe: Recipe, inputs: ProbeInputs, launch: Any):
        assert recipe.train.probe is not None
        self.settings = recipe.train.probe
        self.max_steps = recipe.train.max_steps
        self.inputs, self.launch = inputs, launch
        self.state = ProbeState()

    def due(self, step: int) -> bool:
        """Whether a probe runs after ``step``."""
        return step % self.settings.interval == 0 or step == self.max_steps

    def run(self, step: int, model: Any) -> bool:
        """Probe after ``step``; returns whether the run stops here (the same answer on every process)."""
        acc = self.launch.accelerator
        t0 = time.perf_counter()
        correct, n, nll, by_form, by_depth = self._score(acc.unwrap_model(model))
        seconds = time.perf_counter() - t0
        from ctxext.scoring.stats import wilson_interval

        low, high = wilson_interval(correct, n)
        reading: dict[str, Any] = {"step": step, "rate": correct / n, "correct": correct, "n": n, "by_form": by_form}
        # nll: the answer tokens' mean negative log-likelihood, a curve that moves before the first key is retrieved.
        reading.update(low=low, high=high, nll=nll, seconds=round(seconds, 3))
        if by_depth:  # the target is every depth's: the worst one decides
            reading.update(by_depth=by_depth, score=min(c / m for c, m in by_depth.values()))
        settings = self.settings
        decision: list[Any] = [
            reading,
            *decide(self.state, reading, settings.goal, settings.patience, settings.rule, settings.margin),
        ]
        if acc.num_processes > 1:  # the main process decides; every process stops at the same step
            from accelerate.utils import broadcast_object_list

            broadcast_object_list(decision)
        reading, stop, improved = decision
        self.state.readings.append(reading)
        self.state.probe_seconds += seconds
        if improved:
            best = GOAL_RULES[settings.rule].key(reading)[0]
            self.state.best_rate, self.state.best_step, self.state.since_best = best, step, 0
            self.state.best_weights = trainable_copy(acc.unwrap_model(model))
        else:
            self.state.since_best += 1
        self.state.stopped = stop
        acc.print(self._line(reading, improved))
        return stop is not None

    def _score(self, unwrapped: Any) -> tuple[int, int, float, dict[str, list[int]], dict[str, list[int]]]:
        """Correct answers, answers, the answer tokens' mean NLL, and ``[correct, answers]`` by key form and by depth.

        By depth (``"0"``, ``"25"``, … percent) only with a depth grid (``train.probe.depths``).

        Over every process: each scores its share.
        """
        from accelerate.utils import DistributedType

        from ctxext.scoring.answers import score_answer_sets
        from ctxext.training.sequence_parallel import attention_unsplit

        acc = self.launch.accelerator
        # Every process scores whole key sets on its own (a split's attention is off here), so the shares are over
        # all processes, not the data-parallel ones.
        world, rank = acc.num_processes, acc.process_index
        total = len(self.inputs.sequences)
        # Every process runs the same number of passes (FSDP's forwards talk to each other): padding re-scores
        # key set 0 and does not count it.
        order = list(range(total)) + [-1] * (-total % world)
        mine = order[rank::world]
        lm = unwrapped.peft_model
        was_training = lm.training
        lm.eval()
        # FSDP gathers a layer's weights in its forward: the answer-only last layer calls its parts directly.
        answer_only = acc.distributed_type != DistributedType.FSDP
        with attention_unsplit(lm):
            scores = score_answer_sets(
                lm,
                [self.inputs.sequences[max(i, 0)] for i in mine],
                [self.inputs.spans[max(i, 0)] for i in mine],
                batch_tokens=max(PROBE_BATCH_TOKENS, self.inputs.length),
                answer_only=answer_only,
            )
        lm.train(was_training)
        kept = [(i, per) for i, per in zip(mine, scores, strict=True) if i >= 0]
        counted = [s for _, per in kept for s in per]
        sums = [sum(s.correct for s in counted), len(counted), sum(s.nll for s in counted)]
        sums.append(sum(s.n_tokens for s in counted))
        # By key form, in one order on every process (all hold the same inputs), so one reduce sums them all: a
        # probe that plateaus may be one form the run does not learn, not the length.
        forms = sorted(set(self.inputs.forms))
        for form in forms:
            mine_f = [s for i, per in kept if self.inputs.forms[i] == form for s in per]
            sums += [sum(s.correct for s in mine_f), len(mine_f)]
        grid = self.inputs.grid or []
        for depth in grid:
            mine_d = [s for i, per in kept for s, d in zip(per, self.inputs.depths[i], strict=True) if d == depth]
            sums += [sum(s.correct for s in mine_d), len(mine_d)]
        local = torch.tensor(sums, device=acc.device, dtype=torch.float64)
        summed = acc.reduce(local, "sum") if acc.num_processes > 1 else local
        by_form = {str(f): [int(summed[4 + 2 * k]), int(summed[5 + 2 * k])] for k, f in enumerate(forms)}
        at = 4 + 2 * len(forms)
        by_depth = {f"{100 * d:g}": [int(summed[at + 2 * k]), int(summed[at + 2 * k + 1])] for k, d in enumerate(grid)}
        return int(summed[0]), int(summed[1]), float(summed[2] / summed[3]), by_form, by_depth

    def _line(self, reading: dict[str, Any], improved: bool) -> str:
        best = (
            "best so far"
            if improved
            else f"best {self._judged}{self.state.best_rate:.1%} at step {self.state.best_step}"
        )
        forms, depths = reading.get("by_form") or {}, reading.get("by_depth") or {}
        by_form = "; by key form " + ", ".join(f"{f}: {c}/{n}" for f, (c, n) in forms.items()) if len(forms) > 1 else ""
        if depths:
            by_form += "; by depth " + ", ".join(f"{d} %: {c}/{n}" for d, (c, n) in depths.items())
            by_form += f" (worst {reading['score']:.1%})"
        return (
            f"probe at step {reading['step']}: {reading['correct']}/{reading['n']} keys retrieved at "
            f"{self.inputs.length} tokens ({reading['rate']:.1%}, 95 % CI {reading['low']:.0%}–{reading['high']:.0%}; "
            f"{best}; {reading['seconds']:.1f} s{by_form})"
        )

    @property
    def _judged(self) -> str:
        """What a best is of, for the lines.

        ``(worst depth)`` with a depth grid under the ``worst`` rule; all keys (said by nothing) otherwise.
        """
        return GOAL_RULES[self.settings.rule].judged if self.inputs.grid else ""

    @property
    def every(self) -> str:
        """How the goal applies, for the lines (`` at every depth``, `` over all keys, no depth below 90%``)."""
        if not self.inputs.grid:
            return ""
        if self.settings.rule == "pooled":
            floor = self.settings.goal - self.settings.margin
            return f" over all keys, no depth below {floor:.0%}"
        return " at every depth"

    def restore_best(self, model: Any, step: int) -> bool:
        """Put the best probe's weights back (every process); returns whether they differ from the last step's."""
        if self.state.best_weights is None or self.state.best_step == step:
            return False
        load_trainable(self.launch.accelerator.unwrap_model(model), self.state.best_weights)
        return True

    def outcome(self, step: int) -> str | None:
        """Why the run stopped at ``step``: ``goal``, ``plateau`` or ``ceiling``; ``None`` while it goes on.

        The loop ends only on a probe's stop or at ``train.max_steps``, so a step before the ceiling with no stop
        decided is a run still training (``probe.json`` is rewritten after every probe).
        """
        return self.state.stopped or ("ceiling" if step >= self.max_steps else None)

    def summary_line(self, step: int) -> str:
        """The run's one line on the probe: why it stopped, the best probe, the cost."""
        s, goal = self.state, self.settings.goal
        best = (
            f"best {self._judged}{s.best_rate:.1%} at step {s.best_step}" if s.best_rate is not None else "no probe ran"
        )
        cost = f"probe cost {s.probe_seconds:.1f} s of {s.loop_seconds:.1f} s ({(s.fraction or 0):.1%} of the run)"
        why = self.outcome(step)
        every = self.every
        if why == "goal":
            head = f"probe: goal {goal:.0%}{every} reached at step {step} of at most {self.max_steps}"
        elif why == "plateau":
            head = (
                f"probe: stopped on a plateau at step {step} ({self.settings.patience} probes without a better one; "
                f"goal {goal:.0%}{every} not reached)"
            )
        else:
            head = f"probe: goal {goal:.0%}{every} NOT reached by train.max_steps ({self.max_steps})"
        return f"{head}; {best}, the adapter is that step's; {cost}"

    def record(self, step: int) -> dict[str, Any]:
        """``run.json``'s ``probe``: settings, why it stopped (null while the run goes on), the best probe, the cost."""
        s = self.state
        stopped = self.outcome(step)
        return {
            "length": self.inputs.length,
            "trials": self.inputs.trials,
            "keys": self.settings.keys,
            "interval": self.settings.interval,
            "goal": self.settings.goal,
            "rule": self.settings.rule,
            "margin": self.settings.margin,
            "patience": self.settings.patience,
            "forms": sorted(set(self.inputs.forms)),
            "depths": self.inputs.grid,
            "filler_tokens": self.inputs.filler,
            "window_forms": self.inputs.window_forms,
            "stopped": stopped,
            "stop_step": step if stopped else None,
            "best_step": s.best_step,
            "best_rate": s.best_rate,
            "probes": len(s.readings),
            "seconds": round(s.probe_seconds, 3),
            "loop_seconds": round(s.loop_seconds, 3),
            "fraction": s.fraction,
        }

    def write_curve(self, out: Path, step: int) -> None:
        """``probe.json`` (the curve and the record); main process only."""
        write_json_atomic(out / PROBE_FILE, {**self.record(step), "readings": self.state.readings})

    def write_plot(self, out: Path) -> str | None:
        """``probe.png`` (rate and its interval by step, the goal); a note instead when matplotlib is missing."""
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            return f"{PROBE_PLOT} not written: matplotlib is not installed (pip install matplotlib)"
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ctxext.artifacts.figures import save_figure

        r = self.state.readings
        steps = [x["step"] for x in r]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.fill_between(steps, [x["low"] for x in r], [x["high"] for x in r], alpha=0.25, label="95 % Wilson")
        ax.plot(steps, [x["rate"] for x in r], marker="o", label=f"retrieval at {self.inputs.length} tokens")
        if self.inputs.grid:
            ax.plot(steps, [score_of(x) for x in r], marker=".", linestyle=":", label="its worst depth (decides)")
        ax.axhline(self.settings.goal, color="grey", linestyle="--", label="goal")
        if self.state.best_step is not None:
            ax.axvline(self.state.best_step, color="green", linestyle=":", label="best (the adapter)")
        ax.set(xlabel="optimizer step", ylabel="keys retrieved", ylim=(0, 1.02))
        ax.legend(loc="lower right", fontsize=8)
        save_figure(fig, out, PROBE_PLOT)
        return None


def trainable_copy(unwrapped: Any) -> dict[str, torch.Tensor]:
    """The trainable weights as CPU tensors by name (a sharded DTensor is gathered whole: all processes call this)."""
    out = {}
    for name, param in unwrapped.named_parameters():
        if param.requires_grad:
            data = param.detach()
            if hasattr(data, "full_tensor"):
                data = data.full_tensor()
            out[name] = data.to("cpu", copy=True)
    return out


def load_trainable(unwrapped: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy :func:`trainable_copy`'s weights back into the model (a sharded DTensor takes its own shard)."""
    with torch.no_grad():
        for name, param in unwrapped.named_parameters():
            if name not in weights:
                continue
            value = weights[name].to(param.device, param.dtype)
            if hasattr(param, "device_mesh"):
                from torch.distributed.tensor import distribute_tensor

                value = distribute_tensor(value, param.device_mesh, param.placements)
            param.copy_(value)
