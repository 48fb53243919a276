"""Paired comparison of qeval results: each model against the first (McNemar exact, ppl ratio bootstrap).

python benchmarks/mix_sweep/compare.py REF.jsonl OTHER.jsonl ...
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks._common import mcnemar_vs_reference  # noqa: E402


def main() -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    import numpy as np

    from ctxext.evaluation.stats import paired_ppl_ratio

    results = [json.loads(Path(f).read_text().splitlines()[0]) for f in sys.argv[1:]]
    ref = results[0]
    for r in results:
        print(r["model"], {k: v for k, v in r.items() if not k.startswith("out") and k not in ("doc_nll64", "model")})
        if r is ref:
            continue
        half = len(r["out_needle"]) // 2  # cells: the 64-token length first, then the target
        parts = (
            ("needle@64", "out_needle", slice(0, half)),
            ("needle@T", "out_needle", slice(half, None)),
            ("multikey-2@T", "out_mk", slice(half, None)),
        )
        for key, src, part in parts:
            print(f"   vs {ref['model']} {key}", mcnemar_vs_reference(r[src][part], ref[src][part]))
        a, b = np.array(r["doc_nll64"]), np.array(ref["doc_nll64"])
        p = paired_ppl_ratio(a, b, np.full(len(a), 63.0), resamples=2000, seed=0)
        print(f"   ppl@64 ratio vs {ref['model']}: {p['ratio']:.3f} ({p['ci_low']:.3f}-{p['ci_high']:.3f})")


if __name__ == "__main__":
    main()
