"""RoPE method matrix on the grown model: training-free and after the same short nf4 QLoRA fine-tune.

For each factor (4× and 8× the grown model's 64-token window) and each method (none / linear / ntk / dynamic / yarn
/ llama3), the script chains the public APIs exactly as ``ctxext demo`` does: ``ctxext.models.folder.extend_folder``
(training-free patch), ``ctxext.training.run.train`` (nf4 QLoRA, the demo's recipe with fewer steps; same steps,
data and seed for every method) and ``ctxext.evaluation.suite.run_suite`` with ``ctxext/resources/demo-suite.yaml``
(held-out stdlib files: perplexity per length and position bucket, the context-use curve, in-domain needle
retrieval; 95% CIs). One ``run_suite`` call per factor and stage puts every method side by side on the same data.
``none`` is the unpatched base evaluated past its window (``allow_beyond_for``); it is not fine-tuned (a fine-tune
at its own 64-token window does not teach longer positions, and one at the target length without a RoPE change is
not a method of this matrix).

Every step is cached in ``--out``; a factor can run in its own process (``--factors 4``) and a last call with
all factors (cached) writes ``benchmarks/results/methods.md``.

Usage::

    nice -n 5 python -m benchmarks.methods --factors 4 8 --steps 60 --out /tmp/methods-bench
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "methods.md"
SUITE = ROOT / "ctxext" / "resources" / "demo-suite.yaml"
MODEL = "builtin:grown-code-64"
METHODS = ["none", "linear", "ntk", "dynamic", "yarn", "llama3"]


def recipe(method: str, original: int, target: int, run_dir: Path, args: argparse.Namespace) -> Any:
    """The demo's plain-code fine-tune with this benchmark's steps; identical for every method but the RoPE method."""
    from benchmarks._common import demo_recipe

    overrides = [
        f"model.path={MODEL}",
        f"rope.method={method}",
        f"train.micro_batch_size={args.micro_batch}",
        f"train.learning_rate={args.lr}",
        f"data.max_documents={args.max_documents}",
    ]
    return demo_recipe(run_dir, overrides, original=original, factor=target // original, steps=args.steps, plain=True)


def suite_for(factor: int, args: argparse.Namespace) -> Any:
    """The demo suite with this factor's lengths (1×, factor/2 ×, factor ×) and the benchmark's trial counts."""
    from ctxext.evaluation.suite import load_suite

    half = factor // 2
    ppl_lengths = ["1x", f"{half}x", f"{factor}x"]
    overrides = [
        f"needle.trials={args.trials}",
        "ruler.trials=10",  # the suite's 50 are the demo's; this benchmark's protocol kept 10
        "needle.depths=[10,30,50,70,90]",
        f'needle.lengths=["1x","{factor}x"]',
        f"perplexity.max_docs={args.max_docs}",
        f"perplexity.lengths={json.dumps(ppl_lengths)}",
        "perplexity.context_limits=[8,32,64]",
        f"perplexity.resamples={args.resamples}",
    ]
    suite, _ = load_suite(SUITE, overrides)
    return suite


def run_factor(factor: int, args: argparse.Namespace, timings: dict[str, float]) -> dict[str, Any]:
    """Extend, fine-tune and evaluate every method at one factor; returns both reports."""
    from ctxext.errors import InputError
    from ctxext.evaluation.suite import run_suite
    from ctxext.models.folder import extend_folder
    from ctxext.models.load import ModelSpec
    from ctxext.models.sources import load_config
    from ctxext.rope.read import read_rope
    from ctxext.training.run import read_run
    from ctxext.training.run import train as run_training

    config, _ = load_config(MODEL)
    original = read_rope(config).original_length
    target = original * factor
    out = Path(args.out) / f"x{factor}"
    out.mkdir(parents=True, exist_ok=True)
    methods = [m for m in args.methods if m != "none"]

    for method in methods:
        patched = out / f"patched-{method}"
        if not (patched / "config.json").is_file():
            t0 = time.time()
            extend_folder(MODEL, patched, method, target, overwrite=True)
            timings[f"x{factor} extend {method}"] = time.time() - t0

    reports: dict[str, Any] = {}
    stages = ["free"] + (["finetuned"] if args.steps > 0 else [])
    for stage in stages:
        report_file = out / f"report-{stage}" / "report.json"
        if report_file.is_file():
            reports[stage] = json.loads(report_file.read_text())
            continue
        if stage == "free":
            specs = [ModelSpec(MODEL, name="none")] if "none" in args.methods else []
            specs += [ModelSpec(str(out / f"patched-{m}"), name=m) for m in methods]
            beyond = {0} if "none" in args.methods else None
        else:
            for method in methods:
                run_dir = out / f"ft-{method}"
                try:
                    read_run(run_dir)
                except InputError:
                    if run_dir.exists():
                        shutil.rmtree(run_dir)
                    t0 = time.time()
                    print(f"[x{factor}] fine-tuning {method}: {args.steps} steps at {target} tokens", flush=True)
                    run_training(
                        recipe(method, original, target, run_dir, args), command=["python", "-m", "benchmarks.methods"]
                    )
                    timings[f"x{factor} finetune {method}"] = time.time() - t0
            specs = [ModelSpec(str(out / f"ft-{m}"), name=f"{m}+QLoRA") for m in methods]
            beyond = None
        t0 = time.time()
        print(f"[x{factor}] evaluating {stage}: {[s.name for s in specs]}", flush=True)
        reports[stage] = run_suite(
            suite_for(factor, args),
            specs,
            out / f"report-{stage}",
            suite_path=str(SUITE),
            show_progress=False,
            allow_beyond_for=beyond,
            command="python -m benchmarks.methods",
            overwrite=True,
        )
        timings[f"x{factor} eval {stage}"] = time.time() - t0
    return reports


# --- rendering ---------------------------------------------------------------------------------------------


def _ppl(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    mark = " †" if entry.get("beyond_context") else ""
    return f"{entry['ppl']:.2f} ({entry['ci_low']:.2f}–{entry['ci_high']:.2f}){mark}"


def _acc(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['accuracy']:.0f}% ({100 * cell['ci_low']:.0f}–{100 * cell['ci_high']:.0f}) n={cell['trials']}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _lengths(report: dict[str, Any]) -> list[int]:
    first = report["models"][0].get("perplexity") or {}
    return sorted(int(k) for k in first.get("by_length", {}))


def tables(report: dict[str, Any], title: str) -> list[str]:
    """Markdown tables for one report: ppl by length, ppl by position bucket, context use, needle."""
    models = report.get("models", [])
    lengths = _lengths(report)
    needle_lengths = sorted({int(k) for m in models for k in (m.get("needle") or {}).get("by_length", {})})
    out = [f"#### {title}: perplexity by length and needle accuracy (95% CIs)", ""]
    header = ["method"] + [f"ppl@{L}" for L in lengths] + [f"needle@{L}" for L in needle_lengths]
    rows = []
    for m in models:
        by_length = (m.get("perplexity") or {}).get("by_length", {})
        grid = (m.get("needle") or {}).get("by_length", {})
        rows.append(
            [m["name"]]
            + [_ppl(by_length.get(str(L))) for L in lengths]
            + [_acc(grid.get(str(L))) for L in needle_lengths]
        )
    out += _table(header, rows) + [""]

    buckets = (models[0].get("perplexity") or {}).get("by_bucket") or []
    if buckets:
        out += [f"#### {title}: perplexity by position bucket at {lengths[-1]} tokens", ""]
        header = ["method"] + [f"{b['start']}–{b['end']}" for b in buckets]
        rows = [
            [m["name"]]
            + [f"{b['ppl']:.2f} ({b['ci_low']:.2f}–{b['ci_high']:.2f})" for b in m["perplexity"]["by_bucket"]]
            for m in models
        ]
        out += _table(header, rows) + [""]

    use = (models[0].get("perplexity") or {}).get("context_use") or {}
    if use.get("limits"):
        tg = use["targets"]
        out += [
            f"#### {title}: context use (ppl with context limited to k / full-context ppl, targets at positions "
            f"{tg['start']}–{tg['end']}; >1 = the tokens beyond k help)",
            "",
        ]
        header = ["method", "full-context ppl"] + [f"k={lim['context']}" for lim in use["limits"]]
        rows = []
        for m in models:
            cu = m["perplexity"]["context_use"]
            cells = [_ppl(cu["full"])]
            for lim in cu["limits"]:
                lo, hi = (2.718281828459045 ** lim[k] for k in ("gain_nll_ci_low", "gain_nll_ci_high"))
                cells.append(f"{lim['ppl_ratio']:.3f} ({lo:.3f}–{hi:.3f})")
            rows.append([m["name"]] + cells)
        out += _table(header, rows) + [""]
    return out


def comparisons(reports: dict[int, dict[str, Any]]) -> list[str]:
    """Ratios measured in this run: ppl@target / ppl@1x per method and fine-tuned / training-free."""
    lines = ["#### Ratios (point estimates from the tables above)", ""]
    header = [
        "factor",
        "method",
        "TF ppl@target / own ppl@64",
        "TF ppl@target / base ppl@64",
        "FT ppl@target / base ppl@64",
        "FT / TF ppl@target",
    ]
    rows = []
    for factor, rep in sorted(reports.items()):
        free = {m["name"]: m for m in rep["free"]["models"]}
        ft = {m["name"].removesuffix("+QLoRA"): m for m in rep.get("finetuned", {}).get("models", [])}
        target = _lengths(rep["free"])[-1]
        short = _lengths(rep["free"])[0]

        def ppl(m: dict[str, Any] | None, L: int) -> float | None:
            if not m:
                return None
            e = (m.get("perplexity") or {}).get("by_length", {}).get(str(L))
            return e["ppl"] if e else None

        base = ppl(free.get("none"), short)
        for name in free:
            tf_t, tf_s = ppl(free[name], target), ppl(free[name], short)
            ft_t = ppl(ft.get(name), target)
            rows.append(
                [
                    f"{factor}×",
                    name,
                    f"{tf_t / tf_s:.2f}" if tf_t and tf_s else "-",
                    f"{tf_t / base:.2f}" if tf_t and base else "-",
                    f"{ft_t / base:.2f}" if ft_t and base else "-",
                    f"{ft_t / tf_t:.2f}" if ft_t and tf_t else "-",
                ]
            )
    return lines + _table(header, rows) + [""]


def render(reports: dict[int, dict[str, Any]], args: argparse.Namespace, timings: dict[str, float]) -> str:
    """The results page."""
    import torch

    lines = [
        "# RoPE method matrix on `builtin:grown-code-64` (training-free and after nf4 QLoRA)",
        "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}. Machine: {platform.machine()}, "
        f"{platform.processor() or 'cpu'}, torch {torch.__version__}, {args.threads} torch threads, CPU only "
        "(shared 2-core host).",
        "",
        "Command:",
        "",
        "```",
        f"nice -n 5 python -m benchmarks.methods --factors {' '.join(map(str, args.factors))} --steps {args.steps} "
        f"--micro-batch {args.micro_batch} --lr {args.lr} --trials {args.trials} --max-docs {args.max_docs} "
        f"--threads {args.threads} --out {args.out}",
        "```",
        "",
        f"Protocol: suite `ctxext/resources/demo-suite.yaml` (held-out stdlib files), perplexity on {args.max_docs} "
        f"documents ({args.resamples} bootstrap resamples for CIs), needle `KEY_xy = NNNNN` at depths 10/30/50/70/90%, "
        f"{args.trials} trials per (length, depth) cell (Wilson CIs; n below = trials per length). Fine-tune: the "
        f"demo's recipe (nf4 double-quant, LoRA r=16 α=32 + embed_tokens/norm trainable, builtin:stdlib train split, "
        f"{args.max_documents} documents) with {args.steps} steps, micro-batch {args.micro_batch}, lr {args.lr}, "
        "cosine, seed 0, seq_len = target, identical for every method. `none` = the unpatched base evaluated past "
        "its 64-token window († = beyond the model's context); it is **not fine-tuned** (skipped).",
        "",
    ]
    for factor, rep in sorted(reports.items()):
        lines += [f"## {factor}× ({64 * factor} tokens)", ""]
        lines += tables(rep["free"], f"{factor}× training-free")
        if "finetuned" in rep:
            lines += tables(rep["finetuned"], f"{factor}× after {args.steps}-step nf4 QLoRA")
    lines += comparisons(reports)
    if timings:
        lines += ["#### Timings (seconds, recorded when each step ran; 1 torch thread per factor process)", ""]
        lines += _table(["step", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()]) + [""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--steps", type=int, default=60, help="QLoRA steps (0: training-free only)")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-documents", type=int, default=400)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--max-docs", type=int, default=16)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/methods-bench")
    parser.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/methods.md")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    timings: dict[str, float] = {}
    started = time.time()
    reports = {}
    for factor in args.factors:
        # Timings persist next to the cached steps, so a final all-factors call (cached) still reports them.
        saved = Path(args.out) / f"x{factor}" / "timings.json"
        own: dict[str, float] = json.loads(saved.read_text()) if saved.is_file() else {}
        before = set(timings)
        reports[factor] = run_factor(factor, args, timings)
        own.update({k: timings[k] for k in set(timings) - before})
        saved.write_text(json.dumps(own, indent=1))
        timings.update(own)
    timings["total (this invocation)"] = time.time() - started
    page = render(reports, args, timings)
    print(page)
    if not args.no_write:
        # The hand-written reading of the numbers (from the "## Reading" heading on) survives a rerun.
        old = RESULTS.read_text() if RESULTS.is_file() else ""
        if "\n## Reading" in old:
            page += "\n## Reading" + old.split("\n## Reading", 1)[1]
        RESULTS.write_text(page)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
