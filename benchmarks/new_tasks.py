"""Do the tasks beyond the single needle separate models that the needle does not?

The grown model (64-token window) at 4x its window (256 tokens): the unpatched base, YaRN and llama3
training-free, and the demo's fine-tune (``ctxext demo`` writes all three into its ``--out``). Every task is
scored teacher-forced on the same samples for every model (``ctxext.evaluation.grid.evaluate_task_grid``:
the suite's own grid, seeded by the cell), template 0 (the code forms; the grown model retrieves only
``KEY_xy = ...`` inside its window), 100 trials per (task, depth) cell. Each pair of models is compared
trial by trial (exact McNemar), Holm-adjusted over every task and pair::

    ctxext demo --out runs/demo
    python -m benchmarks.new_tasks --demo runs/demo --out benchmarks/results/new_tasks.md

The tasks are JSON key-value retrieval (HELMET's json_kv) and many-document QA ("which file defines X",
doc_qa) beside the single needle and multi-key retrieval with two distractor keys.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from benchmarks._common import measured_on
from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid, load_haystack
from ctxext.models.load import ModelSpec, load_model
from ctxext.scoring.stats import holm, mcnemar_exact, wilson_interval

TASKS = {  # label -> (task, options)
    "needle": ("needle", {}),
    "multikey-2": ("multikey", {"distractors": 2}),
    "json_kv": ("json_kv", {}),
    "doc_qa": ("doc_qa", {}),
}
DEPTHS = [10, 50, 90]


def main(argv: list[str] | None = None) -> None:
    """Score every model on every task and write the paired comparison."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    ap.add_argument("--demo", type=Path, required=True, help="the folder `ctxext demo --out` wrote")
    ap.add_argument("--base", default="builtin:grown-code-64-mk")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--trials", type=int, default=100, help="per (task, depth) cell")
    ap.add_argument("--out", type=Path, required=True, help="the Markdown result page")
    args = ap.parse_args(argv)
    models = {
        "base": args.base,
        "yarn": str(args.demo / "patched-yarn"),
        "llama3": str(args.demo / "patched-llama3"),
        "fine-tune": str(args.demo / "finetuned"),
    }
    grid = GridSettings(lengths=[args.length], depths=DEPTHS, trials=args.trials, allow_beyond_context=True)
    outcomes: dict[tuple[str, str], list[bool]] = {}
    for name, ref in models.items():
        loaded = load_model(ModelSpec(ref, name=name), device="cpu")
        hay = load_haystack(loaded, "builtin:stdlib", "text", "test", 2 * args.length)
        for label, (task, options) in TASKS.items():
            res = evaluate_task_grid(loaded, grid, task, hay, [0], options, show_progress=False, label=label)
            outcomes[name, label] = [bool(x) for cell in res["cells"] for x in cell["outcomes"]]
            print(f"{name} {label}: {sum(outcomes[name, label])}/{len(outcomes[name, label])}", flush=True)
    _write(args, models, outcomes)


def _write(args: argparse.Namespace, models: dict[str, str], outcomes: dict[tuple[str, str], list[bool]]) -> None:
    lines = [
        f"# Beyond the single needle: paired retrieval at {args.length} tokens (4x the grown model's window)",
        "",
        measured_on(),
        "",
        f"Command: `python -m benchmarks.new_tasks --demo {args.demo} --out {args.out}` (models from `ctxext demo`; "
        f"teacher-forced, template 0, depths {DEPTHS}, {args.trials} trials per (task, depth), the same samples "
        "for every model). Accuracy with its 95 % Wilson interval:",
        "",
        "| model | " + " | ".join(TASKS) + " |",
        "|---|" + "---|" * len(TASKS),
    ]
    for name in models:
        cells = []
        for label in TASKS:
            o = outcomes[name, label]
            low, high = wilson_interval(sum(o), len(o))
            cells.append(f"{100 * sum(o) / len(o):.0f} % [{100 * low:.0f}, {100 * high:.0f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rows = []
    for a, b in itertools.combinations(models, 2):
        for label in TASKS:
            rows.append((a, b, label, mcnemar_exact(outcomes[a, label], outcomes[b, label])))
    adjusted = holm([float(t["p_value"]) for *_, t in rows])
    lines += [
        "",
        f"Paired, trial by trial (exact McNemar; Holm over all {len(rows)} tests): discordant trials "
        "(first model right / second right), p, Holm p; ** Holm p < 0.05.",
        "",
        "| pair | task | + / − | p | Holm p |",
        "|---|---|---|---|---|",
    ]
    for (a, b, label, t), p_holm in zip(rows, adjusted, strict=True):
        mark = " **" if p_holm < 0.05 else ""
        pair = f"{t['only_a']} / {t['only_b']}"
        lines.append(f"| {a} vs {b} | {label} | {pair} | {t['p_value']:.3g} | {p_holm:.3g}{mark} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
