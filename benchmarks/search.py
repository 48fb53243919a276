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
    python benchmarks/search.py --scan-attention /tmp/search-bench/x4 --values 1 1.05 1.1   # price of a factor
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
    name = f"x{factor}" if attention == "1" else f"x{factor}-att-{attention}"
    return Path(args.out) / (name if args.objective == "needle" else f"{name}-{args.objective}")


def run_factor(factor: int, attention: str, args: argparse.Namespace) -> dict[str, Any]:
    """Search (or re-read a finished search) for one factor; returns its report and summary."""
    from ctxext.search import SearchSettings, run_search

    out = run_dir(args, factor, attention)
    if not (out / "report.json").is_file():
        settings = SearchSettings(
            model=MODEL,
            target_length=ORIGINAL * factor,
            out=out,
            objective=args.objective,
            budget_seconds=args.budget,
            population=args.population,
            generations=args.generations,
            samples=args.samples,
            seed=args.seed,
            report_trials=args.trials,
            attention_factor=attention,
            window_tolerance=args.window_tolerance / 100,
            resume=(out / "search.jsonl").is_file(),
            show_progress=False,
        )
        run_search(settings, log=lambda line: print(f"[x{factor} att {attention}] {line}", flush=True))
    return {
        "report": json.loads((out / "report.json").read_text()),
        "summary": json.loads((out / "search.json").read_text()),
    }


def _window_row(att: str, rep: dict[str, Any]) -> str:
    # In-window: the paired ppl ratio and needle difference against the base, and what they allow one to say.
    from ctxext.search.report import window_verdict

    s, base = rep["models"]["searched"], rep["models"]["base"]
    w, n = s["window_vs_base"], s["needle_in_window_vs_base"]
    verdict = window_verdict(w)
    met = {"identical": "yes (identical)", "not detectably changed": "not detectably changed (CI includes 1)"}
    return (
        f"| {att}: in-window retrieval and ppl unchanged | ppl@{ORIGINAL} ratio vs base {w['ratio']:.4f} "
        f"(paired 95% CI {w['ci_low']:.4f} … {w['ci_high']:.4f}, {w['documents']} windows); needle@{ORIGINAL} "
        f"{_pct(s['needle_in_window']['accuracy'])} vs base {_pct(base['needle_in_window']['accuracy'])} "
        f"({100 * n['diff']:+.0f} points, {100 * n['ci_low']:+.0f} … {100 * n['ci_high']:+.0f}) | "
        f"{met.get(verdict, 'no: ppl changed')} |"
    )


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
        f"--samples {args.samples} --seed {args.seed} --objective {args.objective} --attention-factor A "
        f"--window-tolerance {args.window_tolerance:g}`. Search objective `{args.objective}`: "
        "answer NLL of key/value needles at 8 depths over the whole target length, "
        "training-split stdlib files, training templates ("
        + ("mean over all needles" if args.objective == "needle" else "mean of the worst depth")
        + "). In-window: the first 64 tokens of every held-out file that long, paired with the base. "
        "Held-out: stdlib "
        "held-out files; needle = `KEY_xy = NNNNN` (template 0, as in the "
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
        att = f"{factor}× (attention factor {attention}" + (
            f" → {rep['attention_factor']:.4g})" if attention == "search" else ")"
        )
        s = rep["models"]["searched"]
        need = TARGET_MIN_DEPTH.get(factor)
        worst = s["needle"]["min_depth_accuracy"]
        by_depth = ", ".join(_pct(v["accuracy"]) for v in s["needle"]["by_depth"].values())
        if need is not None:
            lines.append(
                f"| {att}: needle ≥ {_pct(need)} at every depth at {rep['target_length']} | "
                f"{by_depth} (worst {_pct(worst)}) | {'yes' if worst >= need else 'no'} |"
            )
        lines.append(_window_row(att, rep))
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


def scan_attention(folder: Path, values: list[float], trials: int) -> str:
    """The price and the gain of each attention factor with one search's long factors (a Markdown table).

    In-window: the paired ppl ratio against the base on the report's held-out windows; beyond: needle
    retrieval by depth at the search's target length (the report's items).
    """
    import numpy as np

    from ctxext.evaluation.loading import ModelSpec, load_model
    from ctxext.search.apply import RopeSwitch
    from ctxext.search.objective import retrieval_set
    from ctxext.search.report import HELDOUT, REPORT_DEPTHS
    from ctxext.search.window import doc_nll, paired_window_ratio, windows

    summary = json.loads((folder / "search.json").read_text())
    target = int(summary["settings"]["target_length"])
    long_factor = np.asarray(summary["long_factor"])
    loaded = load_model(ModelSpec(MODEL), device="cpu")
    switch = RopeSwitch(loaded.model)
    docs = windows(loaded.tokenizer, HELDOUT, ORIGINAL)
    needle = retrieval_set(loaded.tokenizer, HELDOUT, target, REPORT_DEPTHS, trials, 0, "needle", [0])
    switch.restore()
    base = doc_nll(loaded.model, docs)
    depths = " / ".join(f"{d:g}" for d in REPORT_DEPTHS)
    lines = [
        f"| attention factor | ppl@{ORIGINAL} ratio vs base (paired 95% CI) | needle@{target} by depth: {depths} "
        "| worst |",
        "|---|---|---|---|",
    ]
    for value in values:
        switch.use_factors(long_factor, target, value)
        w = paired_window_ratio(doc_nll(loaded.model, docs), base)
        hits = needle.score(loaded.model).correct
        pairs = list(zip(hits, needle.depths, strict=True))
        by_depth = [float(np.mean([h for h, d in pairs if d == x])) for x in REPORT_DEPTHS]
        lines.append(
            f"| {value:g} | {w['ratio']:.4f} ({w['ci_low']:.4f} … {w['ci_high']:.4f}) | "
            + " / ".join(_pct(a) for a in by_depth)
            + f" | {_pct(min(by_depth))} |"
        )
        print(lines[-1], flush=True)
    switch.restore()
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factors", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--budget", default="10m")
    parser.add_argument("--population", type=int, default=32)
    parser.add_argument("--generations", type=int, default=12)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", nargs="+", default=["1"], help="attention factors: 1, auto, search, a number")
    parser.add_argument("--objective", default="needle", help="needle, needle-worst or far-ppl")
    parser.add_argument("--window-tolerance", type=float, default=0.0, help="percent, for --attention search")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="/tmp/search-bench")
    parser.add_argument("--no-write", action="store_true", help="run the searches, do not write the results page")
    parser.add_argument("--note", help="a Markdown file appended to the page (how the runs were made, reading)")
    parser.add_argument("--scan-attention", metavar="FOLDER", help="only scan attention factors with FOLDER's factors")
    parser.add_argument("--values", type=float, nargs="+", default=[1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.155])
    args = parser.parse_args()
    import shutil

    import torch

    torch.set_num_threads(args.threads)
    if args.scan_attention:
        print(scan_attention(Path(args.scan_attention), args.values, args.trials))
        return
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
