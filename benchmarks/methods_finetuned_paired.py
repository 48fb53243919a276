"""Paired comparison of ``benchmarks/methods.py``'s fine-tuned models against ``yarn+QLoRA``.

``methods.py`` evaluates the five fine-tunes of one factor side by side; this script re-evaluates the same
run folders with the same suite and trials, with ``yarn+QLoRA`` as the paired reference, so every
fine-tuned method gets a paired ppl ratio (documents resampled jointly) and exact McNemar tests on the same
retrieval trials, Holm-adjusted over the report.

Usage (after ``methods.py --factors F --steps 60 --out DIR`` has trained the fine-tunes)::

    python -m benchmarks.methods_finetuned_paired --factor 4 --out DIR
    # -> DIR/x4/report-finetuned-paired/report.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import methods  # its suite and folder layout

REFERENCE = "yarn"


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    from ctxext.evaluation.suite import run_suite
    from ctxext.models.load import ModelSpec

    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--factor", type=int, required=True, help="the factor whose fine-tunes to pair (4 or 8)")
    parser.add_argument("--out", default="/tmp/methods-bench", help="methods.py's --out")
    parser.add_argument("--trials", type=int, default=6, help="as methods.py")
    parser.add_argument("--max-docs", type=int, default=16, help="as methods.py")
    parser.add_argument("--resamples", type=int, default=1000, help="as methods.py")
    args = parser.parse_args(argv)

    folder = Path(args.out) / f"x{args.factor}"
    names = [REFERENCE] + [m for m in methods.METHODS if m not in ("none", REFERENCE)]
    missing = [m for m in names if not (folder / f"ft-{m}" / "run.json").is_file()]
    if missing:
        sys.exit(
            f"no fine-tuned run for {missing} in {folder}: run python -m benchmarks.methods --factors {args.factor}"
        )
    specs = [ModelSpec(str(folder / f"ft-{m}"), name=f"{m}+QLoRA") for m in names]
    run_suite(
        methods.suite_for(args.factor, args),
        specs,
        folder / "report-finetuned-paired",
        suite_path=str(methods.SUITE),
        show_progress=False,
        command=" ".join(["python", "-m", __spec__.name, *(sys.argv[1:] if argv is None else argv)]),
        overwrite=True,
        reference=f"{REFERENCE}+QLoRA",
    )
    print(folder / "report-finetuned-paired" / "report.md")


if __name__ == "__main__":
    main()
