"""Replay the transfer runs' probe curves under another goal rule: where would each run have stopped?

    python -m experiments.transfer.goals experiments/results/transfer-runs/*
    python -m experiments.transfer.goals experiments/results/transfer-runs/* --rule pooled --margin 0.05

Every fine-tuned seed of ``experiments.transfer.run`` (its folder, or its archive) carries its probe's readings,
each with the keys retrieved at every depth. The adaptive stop judges a reading by its worst depth (the default
``train.probe.rule``, ``worst``); with 32 trials per depth that reading is noisy (a model at 96 % at every depth
passes a given probe with probability ~0.1), so runs near the goal go on to the ceiling. This replays each run's
curve under a rule of :data:`ctxext.training.probe.GOAL_RULES` (the recipe's ``train.probe.rule``, one
implementation) and says, per run, the step it would have stopped at and what the probe read there, and in all,
the training steps it would have saved (a run that never meets the rule trains to where it stopped). It cannot say
what the evaluation would have read: a run stopped by the rule keeps the adapter of the reading that met it, and
where that is not the one evaluated (``other adapter``) the run needs training again to be judged.
"""

import argparse
import json
from pathlib import Path
from typing import Any

from ctxext.training.probe import GOAL_RULES
from experiments.transfer.read import run_summary


def _counts(reading: dict[str, Any]) -> list[tuple[int, int]]:
    return [(int(c), int(n)) for c, n in reading["by_depth"].values()]


def replay(run: dict[str, Any], rule: str, margin: float) -> dict[str, Any] | None:
    """One run's replayed stop: the first reading the rule calls the goal, or ``None`` (the run's ceiling)."""
    probe = run["probe"]
    judge = GOAL_RULES[rule]
    return next((r for r in run["readings"] if judge.met(r, probe["goal"], margin)), None)


def lines(folders: list[Path], rule: str, margin: float, arms: list[str] | None = None) -> list[str]:
    """Per run (of ``arms``, or every arm): recorded stop, replayed stop and its reading; then the steps saved."""
    out, trained, replayed = [], 0, 0
    for folder in folders:
        for path in sorted(folder.glob("eval-*-s*.json")):
            e = json.loads(path.read_text())
            if e["model"] in ("base", "llama3") or (arms and e["model"] not in arms):
                continue
            run = run_summary(e)  # the archived summary, or the run folder's record and probe curve
            readings = run["readings"] or []
            if not readings or "by_depth" not in readings[0]:
                continue  # no fine-tune, or a probe from before depths were counted
            probe = run["probe"]
            hit = replay(run, rule, margin)
            stop = hit["step"] if hit else probe["stop_step"]
            trained += probe["stop_step"]
            replayed += min(stop, probe["stop_step"])
            where = f"never met: {probe['stopped']} at {probe['stop_step']}"
            if hit:
                depths = ", ".join(f"{c}/{n}" for c, n in _counts(hit))
                same = "same adapter" if hit["step"] == probe["best_step"] else "other adapter"
                where = f"step {hit['step']} (all {100 * hit['rate']:.0f} %, by depth {depths}; {same})"
            out.append(
                f"| {folder.name} | {e['model']} | {e['seed']} | {probe['stopped']} at {probe['stop_step']}, "
                f"best {probe['best_step']} | {where} |"
            )
    if not out:
        return ["No fine-tuned run with a probe that counts keys by depth in these folders."]
    head = [f"| base | arm | seed | recorded stop | `{rule}` stop |", "| --- | --- | --- | --- | --- |"]
    tail = (
        f"Training steps: {trained} recorded, {replayed} under `{rule}` ({100 * (1 - replayed / trained):.0f} % fewer)."
    )
    return [*head, *out, "", tail]


def main(argv: list[str] | None = None) -> None:
    """Print the replay as a markdown table."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", type=Path, help="runs/transfer/NAME folders or their archives")
    parser.add_argument("--rule", choices=sorted(GOAL_RULES), default="pooled", help="the goal rule to replay")
    parser.add_argument("--arm", nargs="+", help="only these arms (default: every fine-tuned one)")
    parser.add_argument("--margin", type=float, default=0.05, help="`pooled`: how far below the goal a depth may be")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    print("\n".join(lines(args.folders, args.rule, args.margin, args.arm)))


if __name__ == "__main__":
    main()
