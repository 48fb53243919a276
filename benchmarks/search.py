"""RoPE factor search on the grown model at 4× and 8× its 64-token window, against the named methods.

For each factor, ``ctxext.search.run_search`` (what ``ctxext search`` runs) searches long factors on the
training split with the needle-driven objective, within a time budget, and compares them on held-out
files with the unpatched base and PI / NTK / YaRN / llama3 at their defaults, all on the same items in
the same run (the report's paired statistics). The page ``benchmarks/results/search.md`` gets each
factor's table, the search's wall and CPU time and its number of evaluations, and the issue's targets
checked one by one.

Usage::

    python benchmarks/search.py --factors 4 8 --budget 10m --population 32 --generations 12 --out /tmp/search-bench
    python benchmarks/search.py --factors 4 --no-write --out /tmp/search-bench   # one factor per process; a
    python benchmarks/search.py --factors 4 8 --out /tmp/search-bench            # last call re-reads and writes
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's ctxext, also when another one is installed
RESULTS = ROOT / "benchmarks" / "results" / "search.md"
MODEL = "builtin:grown-code-64"
ORIGINAL = 64
TARGET_MIN_DEPTH = {4: 0.8, 8: 0.6}


def run_dir(args: argparse.Namespace, factor: int, attention: str) -> Path:
    """The output folder of one (factor, attention factor) search."""
    return Path(args.out) / (f"x{factor}" if attention == "1" else f"x{factor}-att-{attention}")


def run_factor(factor: int, attention: str, args: argparse.Namespace) -> dict[str, Any]:
    """Search (or re-read a finished search) for one factor; returns its report and summary."""
    from ctxext.search import SearchSettings, run_search

    out = run_dir(args, factor, attention)
    if not (out / "report.json").is_file():
        settings = SearchSettings(
            model=MODEL,
            target_length=ORIGINAL * factor,
            out=out,
            budget_seconds=args.budget,
            population=args.population,
            generations=args.generations,
            samples=args.samples,
            seed=args.seed,
            report_trials=args.trials,
            attention_factor=attention,
            resume=(out / "search.jsonl").is_file(),
            show_progress=False,
        )
        run_search(settings, log=lambda line: print(f"[x{factor} att {attention}] {line}", flush=True))
    return {
        "report": json.loads((out / "report.json").read_text()),
        "summary": json.loads((out / "search.json").read_text()),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def render(results: dict[tuple[int, str], dict[str, Any]], args: argparse.Namespace) -> str:
    """The results page."""
    from ctxext.search.budget import parse_budget
    from ctxext.search.report import render_markdown

    lines = [
        "# RoPE factor search on `builtin:grown-code-64` (training-free, 4× and 8×)",
        "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()}, CPU only, "
        f"{args.threads} torch thread(s) per process, a 2-core host shared with other jobs (wall times are "
        "pessimistic; CPU times are the search process's own).",
        "",
        "Command:",
        "",
        "```",
        " ".join(["python", "benchmarks/search.py", *sys.argv[1:]]),
        "```",
        "",
        "Each factor is the same as `ctxext search builtin:grown-code-64 --target-length N --out DIR "
        f"--budget {args.budget} --population {args.population} --generations {args.generations} "
        f"--samples {args.samples} --seed {args.seed} --attention-factor A`. Search objective: needle-driven "
        "(mean NLL of the answer tokens of key/value needles at 8 depths over the whole target length, "
        "training-split stdlib files, "
        "training templates). Held-out: stdlib held-out files; needle = `KEY_xy = NNNNN` (template 0, as in the "
        f"demo suite) at depths 10/30/50/70/90 %, {args.trials} trials per depth, teacher-forced; multikey = the "
        "same needle among 3 distractor keys; held-out objective = the search objective on held-out files "
        "(new samples). All variants are scored on the same items.",
        "",
        "## Done-when targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for (factor, attention), r in results.items():
        rep, summ = r["report"], r["summary"]
        att = f"{factor}× (attention factor {attention})"
        s = rep["models"]["searched"]
        base = rep["models"]["base"]
        need = TARGET_MIN_DEPTH.get(factor)
        worst = s["needle"]["min_depth_accuracy"]
        by_depth = ", ".join(_pct(v["accuracy"]) for v in s["needle"]["by_depth"].values())
        if need is not None:
            lines.append(
                f"| {att}: needle ≥ {_pct(need)} at every depth at {rep['target_length']} | "
                f"{by_depth} (worst {_pct(worst)}) | {'yes' if worst >= need else 'no'} |"
            )
        same_window = rep["in_window_max_abs_nll_diff_vs_base"] == 0.0
        lines.append(
            f"| {att}: in-window retrieval and ppl unchanged | needle@{ORIGINAL} "
            f"{_pct(s['needle_in_window']['accuracy'])} vs base {_pct(base['needle_in_window']['accuracy'])}, "
            f"ppl@{ORIGINAL} {s['ppl_window']['ppl']:.3f} vs {base['ppl_window']['ppl']:.3f} "
            f"(max abs ΔNLL {rep['in_window_max_abs_nll_diff_vs_base']:.1e}) | {'yes' if same_window else 'no'} |"
        )
        obj = rep["comparison"]["objective"]
        lines.append(
            f"| {att}: beats the best named method ({rep['comparison']['best_named']}) on the held-out "
            f"objective, paired CI excludes 0 | {obj['diff']:+.4f} NLL/token ({obj['ci_low']:+.4f} … "
            f"{obj['ci_high']:+.4f}) | {'yes' if obj['ci_high'] < 0 else 'no'} |"
        )
        # The budget is checked before each evaluation: the last one may end a few seconds past it.
        budget = parse_budget(summ["settings"]["budget_seconds"])
        in_budget = summ["seconds"] <= 600 or (summ["ended"] == "budget" and budget <= 600)
        lines.append(
            f"| {att}: search ≤ 10 min on 2 cores | {summ['seconds']:.0f} s wall (budget "
            f"{budget:.0f} s), {summ['cpu_seconds']:.0f} s CPU, "
            f"{summ['evaluations']} evaluations, ended by {summ['ended']} | {'yes' if in_budget else 'no'} |"
        )
    for (factor, attention), r in results.items():
        body = render_markdown(r["report"], r["summary"]).split("\n", 2)[2]
        png = f"search-{run_dir(args, factor, attention).name}-factors.png"
        body = body.replace("![factors](factors.png)", f"![factors ×{factor}]({png})")
        title = f"## {factor}× ({ORIGINAL} → {ORIGINAL * factor} tokens), attention factor {attention}"
        lines += ["", title, "", body.strip()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factors", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--budget", default="10m")
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--generations", type=int, default=12)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", nargs="+", default=["1"], help="attention factors to search with: 1, auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="/tmp/search-bench")
    parser.add_argument("--no-write", action="store_true", help="run the searches, do not write the results page")
    parser.add_argument("--note", help="a Markdown file appended to the page (how the runs were made, reading)")
    args = parser.parse_args()
    import shutil

    import torch

    torch.set_num_threads(args.threads)
    results = {(f, a): run_factor(f, a, args) for f in args.factors for a in args.attention}
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        for f, a in results:
            folder = run_dir(args, f, a)
            shutil.copy2(folder / "factors.png", RESULTS.parent / f"search-{folder.name}-factors.png")
        text = render(results, args)
        if args.note:
            text += "\n## How this page was produced\n\n" + Path(args.note).read_text()
        RESULTS.write_text(text)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
