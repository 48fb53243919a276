"""Read a base's transfer runs against issue 37's relative target, pooled over seeds, with paired tests.

    python -m experiments.transfer.read runs/transfer/grown-code-64 [--arm default] [--page FILE.md]
    python -m experiments.transfer.read runs/transfer/* --arm probe --against default --page PAGE.md
    python -m experiments.transfer.read runs/transfer/NAME --arm probe --archive experiments/results/transfer-runs
    python -m experiments.transfer.read experiments/results/transfer-runs/NAME --arm probe   # the same reading

The target (relative to the base, :mod:`ctxext.evaluation.target`, which ``ctxext demo`` prints too): at 4× its
window, at every depth, retrieval ≥ the lower of 90 % and the base's own in-window accuracy at that depth minus 3
points; in-window retrieval no more than 3 points below the base; in-window perplexity no more than 3 % above it.
The reading: each depth's trials of every seed pooled (≥ 300 with 3 seeds of 100); a depth passes when the pooled
rate meets its target and the Wilson 95 % lower bound is within 5 points of it. Every seed's prompts are fresh
(seeded by the training seed), so pooled trials are distinct prompts and the Wilson interval applies as it stands
(no prompt is re-scored across seeds: no cluster bootstrap needed).
Paired tests: the arm against the ``llama3`` training-free start on the same prompts (exact McNemar per depth, Holm
over the depths), and the in-window perplexity ratio against the base over the documents (the seeds' mean NLL per
document; 95 % paired bootstrap). ``--against ARM ...`` adds each arm against the other arms named, on the seeds
they share, at the target (exact McNemar per depth on the same prompts, Holm over the depths). Per seed: the step
it stopped at and why, the probe's curve, and the training steps' time (the sum over steps of tokens / tokens per
second from the run's ``metrics.jsonl``: compute, without evaluations or probes) and the probes' time.
An arm's file (``WORK/NAME/ARM.json``) may carry a ``note`` written by hand: what the default recipe was when the
arm ran, where the code has changed since (the heading prints it beside the arm's overrides).
``--archive DIR`` copies what the reading needs into ``DIR/NAME`` (the evaluations, each fine-tuned seed's with its
run's summary: a few KB per seed), which reads as the folder does once the run folders (hundreds of MB, on a
machine that may be replaced) are gone.
"""

import argparse
import json
from pathlib import Path
from typing import Any

DEPTHS = [0, 25, 50, 75, 100]
# Training seeds a claim rests on (issue 37, answer 1).
MIN_SEEDS = 3


def load(folder: Path, model: str) -> list[dict[str, Any]]:
    """Every seed's evaluation of ``model``, by seed."""
    files = sorted(folder.glob(f"eval-{model}-s*.json"), key=lambda p: int(p.stem.rsplit("-s", 1)[1]))
    return [json.loads(p.read_text()) for p in files]


def pooled(evals: list[dict[str, Any]], length: int, depth: int) -> list[int]:
    """The cell's outcomes, every seed's in seed order (paired across models of the same seeds)."""
    return [o for e in evals for o in e["needle"][f"{length}/{depth}"]]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def steps_seconds(run_dir: Path) -> float:
    """The training steps' compute time: the sum of each step's tokens over its tokens per second.

    A resumed run logs the steps after its checkpoint again; each logged step counts (it was computed).
    """
    seconds, seen_at = 0.0, {0: 0}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("tokens_per_sec"):
            step, seen = row["step"], row["tokens_seen"]
            tokens = seen - seen_at.get(step - 1, seen - seen / step)
            seconds += tokens / row["tokens_per_sec"]
            seen_at[step] = seen
    return seconds


def run_summary(e: dict[str, Any]) -> dict[str, Any]:
    """What the reading needs of a fine-tuned seed's run folder: its record's probe and steps, the probe's readings
    and the training steps' time (an archived evaluation carries it: :func:`archive`)."""
    if "run" in e:
        return e["run"]
    run_dir = Path(e["ref"])
    record = json.loads((run_dir / "run.json").read_text())
    probe_file = run_dir / "probe.json"
    readings = json.loads(probe_file.read_text())["readings"] if probe_file.is_file() else None
    return {
        "probe": record.get("probe") or {},
        "steps": record.get("steps"),
        "readings": readings,
        "steps_seconds": steps_seconds(run_dir),
    }


def _arm_recipe(info: dict[str, Any]) -> str:
    """What an arm trained with: its overrides of the default recipe, and (``note``, written by hand into an arm's
    file) what the default was when it ran, where the code has changed since."""
    what = " ".join(info["sets"]) or "no overrides of the default recipe"
    return f"{what}; {info['note']}" if info.get("note") else what


def seed_line(e: dict[str, Any]) -> str:
    """One seed's run: where and why it stopped, its probe curve, its time."""
    run = run_summary(e)
    probe = run["probe"]
    why = probe.get("stopped") or f"train.max_steps ({run['steps']} steps, no probe)"
    line = f"- seed {e['seed']}: stopped at step {probe.get('stop_step', run['steps'])}: {why}"
    readings = run["readings"]
    if readings is not None:
        curve = " → ".join(_pct(r["rate"]) for r in readings)
        best = next((r for r in readings if r["step"] == probe["best_step"]), {})
        # Runs since the probe judges by depth: their best is the worst depth's rate (all keys' rate beside it).
        judged = f"all {_pct(best['rate'])} %, worst depth " if "score" in best else ""
        line += (
            f"; probe at {probe['length']} tokens every {probe['interval']} steps ({probe['trials']} trials): "
            f"{curve} %, best step {probe['best_step']} ({judged}{_pct(probe['best_rate'])} %)"
        )
        forms = best.get("by_form") or {}
        if len(forms) > 1:  # runs since the probe counts keys by form
            line += " by key form " + ", ".join(f"{f}: {_pct(c / n)} %" for f, (c, n) in forms.items())
        asked = probe.get("forms")
        checked = probe.get("window_forms")
        if asked and checked is not None:  # runs since the probe asks in the base's forms
            # The in-window check keeps the forms the base retrieves; when it keeps none the probe asks in all.
            why = "the base's in its window" if any(f.get("kept") for f in checked) else "all: the base retrieves none"
            line += f", asked in form(s) {', '.join(map(str, asked))} ({why})"
    line += f"; training steps {run['steps_seconds'] / 60:.0f} min"
    if probe:
        line += f", probes {probe['seconds'] / 60:.1f} min"
    return line + f"; attention temperature {e.get('attention_temperature') or 1.0}"


def against_lines(folder: Path, arm: str, other: str, tuned: list[dict[str, Any]], target: int) -> list[str]:
    """The arm against another arm on the same seeds' prompts at the target, per depth."""
    from ctxext.scoring.stats import holm, mcnemar_exact

    by_seed = {e["seed"]: e for e in load(folder, other)}
    shared = [e for e in tuned if e["seed"] in by_seed]
    if not shared:
        return [f"- against `{other}`: no evaluation of the same seeds yet"]
    theirs = [by_seed[e["seed"]] for e in shared]
    # Per depth, this arm's and the other's outcomes on the same prompts.
    pairs = [
        ([bool(x) for x in pooled(shared, target, d)], [bool(x) for x in pooled(theirs, target, d)]) for d in DEPTHS
    ]
    tests = [mcnemar_exact(mine, other_s) for mine, other_s in pairs]
    cells = [
        f"{d} % {_pct(sum(other_s) / len(other_s))} (+{t['only_a']}/−{t['only_b']}, p = {p:.2g})"
        for d, (_, other_s), t, p in zip(DEPTHS, pairs, tests, holm([t["p_value"] for t in tests]), strict=True)
    ]
    both = mcnemar_exact([x for mine, _ in pairs for x in mine], [x for _, other_s in pairs for x in other_s])
    seeds = ", ".join(str(e["seed"]) for e in shared)
    return [
        f"- against `{other}` at {target} tokens (seeds {seeds}; `{other}`'s rate, this arm's +/− trials, Holm p): "
        + "; ".join(cells)
        + f"; all depths +{both['only_a']}/−{both['only_b']}, p = {both['p_value']:.2g}"
    ]


def read(folder: Path, arm: str, against: list[str] | None = None) -> list[str]:
    """The base's reading as markdown lines."""
    import numpy as np

    from ctxext.evaluation.target import MEETS, in_window_kept, perplexity_kept, read_depth
    from ctxext.scoring.stats import holm, mcnemar_exact, paired_ppl_ratio

    info = json.loads((folder / f"{arm}.json").read_text())
    window, target = info["window"], info["target"]
    tuned = load(folder, arm)
    seeds = [e["seed"] for e in tuned]
    # The base and the start of the arm's seeds (another arm may have more).
    base = [e for e in load(folder, "base") if e["seed"] in seeds]
    start = [e for e in load(folder, "llama3") if e["seed"] in seeds]
    if not tuned or [e["seed"] for e in base] != seeds or [e["seed"] for e in start] != seeds:
        raise SystemExit(f"{folder}: the base or llama3 evaluation of a {arm} seed is missing; run it again")
    lines = [
        f"### {folder.name}: arm `{arm}` ({_arm_recipe(info)}), "
        f"{window} → {target} tokens, seeds {', '.join(map(str, seeds))}",
        "",
        "| depth | base in-window | target | arm at target [Wilson 95 %] | passes | llama3 start at target | "
        "arm vs start (McNemar +/−) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    p_values, rows = [], []
    for depth in DEPTHS:
        t = pooled(tuned, target, depth)
        reading = read_depth(depth, pooled(base, window, depth), t)
        s = pooled(start, target, depth)
        mc = mcnemar_exact([bool(x) for x in t], [bool(x) for x in s])
        p_values.append(mc["p_value"])
        rows.append((reading, s, mc))
    every = all(reading.state == MEETS for reading, _, _ in rows)
    for (r, s, mc), p in zip(rows, holm(p_values), strict=True):
        low, high = r.interval
        lines.append(
            f"| {r.depth:g} % | {_pct(r.base_rate)} (n={r.base_trials}) | {_pct(r.target)} | {_pct(r.rate)} "
            f"[{_pct(low)}, {_pct(high)}] (n={r.trials}) | {'✓' if r.state == MEETS else '✗'} | "
            f"{_pct(sum(s) / len(s))} | +{mc['only_a']}/−{mc['only_b']}, Holm p = {p:.2g} |"
        )
    b_in = [o for d in DEPTHS for o in pooled(base, window, d)]
    t_in = [o for d in DEPTHS for o in pooled(tuned, window, d)]
    mc_in = mcnemar_exact([bool(x) for x in t_in], [bool(x) for x in b_in])
    in_ok = in_window_kept(sum(t_in) / len(t_in), sum(b_in) / len(b_in))
    tuned_nll = np.mean([e["doc_nll"] for e in tuned], axis=0)
    base_nll = np.array(base[0]["doc_nll"])
    counts = np.full(len(base_nll), float(base[0]["tokens_per_doc"]))
    ratio = paired_ppl_ratio(tuned_nll, base_nll, counts, resamples=2000, seed=0)
    ppl_ok = perplexity_kept(ratio["ratio"])
    lines += [
        "",
        f"- In-window retrieval ({window} tokens, all depths): arm {_pct(sum(t_in) / len(t_in))} %, base "
        f"{_pct(sum(b_in) / len(b_in))} % (n={len(b_in)}; McNemar +{mc_in['only_a']}/−{mc_in['only_b']}, "
        f"p = {mc_in['p_value']:.2g}): {'✓' if in_ok else '✗'} (at most 3 points below)",
        f"- In-window perplexity, arm / base: {ratio['ratio']:.3f} [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}] "
        f"over {len(base_nll)} documents: {'✓' if ppl_ok else '✗'} (at most 1.03)",
    ]
    lines += [seed_line(e) for e in tuned]
    for other in against or []:
        if other != arm and (folder / f"{other}.json").is_file():
            lines += against_lines(folder, arm, other, tuned, target)
    met = every and in_ok and ppl_ok
    # Answer 1 of issue 37: a claim rests on >= 3 training seeds; fewer is a reading on the way to one.
    short = ""
    if len(tuned) < MIN_SEEDS:
        short = f" From {len(tuned)} seed(s): a reading, not a claim (a claim needs {MIN_SEEDS})."
    lines += ["", f"**{'Meets' if met else 'Does not meet'} the relative target** at 4× ({target} tokens).{short}", ""]
    return lines


def archive(folder: Path, arms: list[str], into: Path) -> Path:
    """Copy what the reading of ``arms`` needs into ``into/NAME``: the arms' settings and every evaluation of them,
    the base and the start, each fine-tuned seed's with its run's summary (:func:`run_summary`), a few KB per seed.
    The copy reads as the folder does (``read into/NAME``) once the run folders, hundreds of MB, are gone."""
    dest = into / folder.name
    dest.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        if (folder / f"{arm}.json").is_file():
            (dest / f"{arm}.json").write_text((folder / f"{arm}.json").read_text())
    for model in {"base", "llama3", *arms}:
        for e in load(folder, model):
            if model not in ("base", "llama3"):
                e = {**e, "run": run_summary(e)}
            # One line, as experiments.transfer.run writes them: the outcome lists stay a few KB.
            (dest / f"eval-{model}-s{e['seed']}.json").write_text(json.dumps(e) + "\n")
    return dest


def write_page(path: Path, title: str, module: str, argv: list[str] | None, about: str, lines: list[str]) -> None:
    """A result page: its title, the command that wrote it (``python -m MODULE`` and its arguments) with the date
    and ``about`` after them, then ``lines``."""
    import datetime
    import sys

    command = " ".join([f"python -m {module}", *(sys.argv[1:] if argv is None else argv)])
    head = [f"# {title}", "", f"Command: `{command}`, on {datetime.date.today()}{about}", ""]
    path.write_text("\n".join(head + lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Print (or write) the reading of each folder."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", help="runs/transfer/NAME folders (experiments.transfer.run)")
    parser.add_argument("--arm", nargs="+", default=["default"], help="the arms to read, each in turn")
    parser.add_argument("--against", nargs="+", default=[], help="arms to pair each arm with (same seeds)")
    parser.add_argument("--page", default=None, help="write the reading to this markdown file too")
    parser.add_argument(
        "--archive",
        default=None,
        help="also copy what the reading needs (a few KB per seed) into ARCHIVE/NAME, readable as the folder is",
    )
    args = parser.parse_args(argv)
    lines = [
        line
        for folder in args.folders
        for arm in args.arm
        if (Path(folder) / f"{arm}.json").is_file()
        for line in read(Path(folder), arm, args.against)
    ]
    print("\n".join(lines))
    for folder in args.folders if args.archive else []:
        print(f"archived: {archive(Path(folder), [*args.arm, *args.against], Path(args.archive))}")
    if args.page:
        title = f"Transfer of the default recipe: arms {', '.join(f'`{a}`' for a in args.arm)} against issue 37's "
        about = (
            ", from the runs of `python -m experiments.transfer.run` (its docstring: seeds, prompts, evaluation). The "
            "target and the reading: the docstring of `experiments/transfer/read.py`. Machine: the shared 2-core "
            "x86_64 CPU, one thread per run."
        )
        write_page(Path(args.page), title + "relative target", __spec__.name, argv, about, lines)


if __name__ == "__main__":
    main()
