"""Paired comparison of qeval results: each model against the first (McNemar exact, ppl ratio bootstrap).

python -m experiments.mix_sweep.compare REF.jsonl OTHER.jsonl ...

A reference measured in its window only (``qeval.py BASE WINDOW N``: one length) is compared with the others'
in-window cells (a cell's trials are seeded by the cell alone); its ppl documents are other documents (those
of at least WINDOW tokens), so the ppl ratio to it is each model's own ``ppl64_vs_base`` (qeval pairs it with
``BASE`` on the model's documents). ``--original`` (or ``ORIGINAL``) is the window (default 64), the tokens per
document of the ratio.
"""

import argparse
import json
import os
from pathlib import Path

from benchmarks._common import mcnemar_vs_reference


def main(argv: list[str] | None = None) -> None:
    """Print each model's summary and its paired tests against the first."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path, help="qeval output files, the reference first")
    original = os.environ.get("ORIGINAL", "64")
    parser.add_argument("--original", type=int, default=original, help="the window in tokens (env ORIGINAL)")
    args = parser.parse_args(argv)
    import numpy as np

    from ctxext.scoring.stats import paired_ppl_ratio

    results = [json.loads(f.read_text().splitlines()[0]) for f in args.files]
    ref = results[0]
    window = args.original
    for r in results:
        print(r["model"], {k: v for k, v in r.items() if not k.startswith("out") and k not in ("doc_nll64", "model")})
        if r is ref:
            continue
        half = len(r["out_needle"]) // 2  # cells: the in-window length first, then the target
        window_only = len(ref["out_needle"]) == half
        parts = [("needle@window", "out_needle", slice(0, half), slice(0, half))]
        if not window_only:
            parts += [
                ("needle@T", "out_needle", slice(half, None), slice(half, None)),
                ("multikey-2@T", "out_mk", slice(half, None), slice(half, None)),
            ]
        for key, src, part, ref_part in parts:
            print(f"   vs {ref['model']} {key}", mcnemar_vs_reference(r[src][part], ref[src][ref_part]))
        if window_only:
            continue
        a, b = np.array(r["doc_nll64"]), np.array(ref["doc_nll64"])
        p = paired_ppl_ratio(a, b, np.full(len(a), window - 1.0), resamples=2000, seed=0)
        print(f"   ppl@window ratio vs {ref['model']}: {p['ratio']:.3f} ({p['ci_low']:.3f}-{p['ci_high']:.3f})")


if __name__ == "__main__":
    main()
