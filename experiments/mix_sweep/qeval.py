"""Quick evaluation of sweep arms on held-out stdlib files, with per-trial outcomes for paired tests.

    python -m experiments.mix_sweep.qeval runs/sweep/A,runs/sweep/B 256 50 > evals.jsonl
    BASE=ctxext/resources/grown-mistral-128 ORIGINAL=128 python -m experiments.mix_sweep.qeval runs/sweep/C 512 50

Per model (one JSON line): teacher-forced ``needle`` (form t0, the demo's) in the window (``ORIGINAL``, 64 tokens
by default) and at the target by depth (0/25/50/75/100 %), ``multikey`` with 2 distractors (t0) at both lengths, and the
per-document NLL of the first ``ORIGINAL`` tokens of 32 documents with the ppl ratio to the unpatched base's
(95 % paired bootstrap). Trials are seeded as in ``benchmarks/finetune_mix.py`` (1234 needle, 4321
multi-key; ``--seed`` moves both, multi-key at seed + 3087), so every model sees the same trials. Each option
can also be given as an environment variable, as the sweep's logged commands do: ``THREADS`` (torch's threads,
default 1), ``BASE`` (the unpatched base of the ppl ratio, default ``builtin:grown-code-64``), ``ORIGINAL`` (the
base's window, default 64: the in-window needle length and the tokens of the ppl ratio), ``SEED`` (default 1234).
"""

import argparse
import json
import os
import time
from pathlib import Path

DEPTHS = [0, 25, 50, 75, 100]


def main(argv: list[str] | None = None) -> None:
    """Evaluate each model; print one JSON line per model."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", help="model folders, comma-separated")
    parser.add_argument("target", type=int, help="the target length in tokens")
    parser.add_argument("trials", type=int, help="needle trials per (length, depth) cell")
    parser.add_argument("--base", default=env("BASE", "builtin:grown-code-64"), help="the unpatched base (env BASE)")
    parser.add_argument("--original", type=int, default=env("ORIGINAL", "64"), help="its window (env ORIGINAL)")
    parser.add_argument("--seed", type=int, default=env("SEED", "1234"), help="the trials' seed (env SEED)")
    parser.add_argument("--threads", type=int, default=env("THREADS", "1"), help="torch threads (env THREADS)")
    args = parser.parse_args(argv)
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.stats import paired_ppl_ratio
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack
    from experiments.mix_sweep._probe import document_nll, stdlib_documents

    torch.set_num_threads(args.threads)
    paths, target, trials = args.models.split(","), args.target, args.trials
    window = args.original
    seed = args.seed  # other trials, to check that a result is not one draw's
    tok = AutoTokenizer.from_pretrained(paths[0])
    hay = Haystack.from_texts(tok, iter_texts("builtin:stdlib"), 200_000, "builtin:stdlib")
    docs = stdlib_documents(tok, target)

    def doc_nll(loaded, length):
        return [float(x) for x in document_nll(loaded.model, docs, length).sum(dim=1)]

    base = ModelSpec(args.base, name="base")
    base_nll = doc_nll(load_model(base, device="cpu"), window)
    for path in paths:
        started = time.time()
        loaded = load_model(ModelSpec(path, name=Path(path).name), device="cpu")
        res: dict = {"model": path}
        grid = GridSettings(lengths=[window, target], depths=DEPTHS, trials=trials, seed=seed)
        g = evaluate_task_grid(loaded, grid, "needle", hay, template=0, show_progress=False)
        far = [c for c in g["cells"] if c["length"] == target]
        res.update(
            needle64=round(100 * g["by_length"][str(window)]["accuracy"]),
            lb64=round(100 * g["by_length"][str(window)]["ci_low"]),
            needleT=round(100 * g["by_length"][str(target)]["accuracy"]),
            depthT=[round(100 * c["accuracy"]) for c in far],
            worst_lb=min(round(100 * c["ci_low"]) for c in far),
            out_needle=[o for c in g["cells"] for o in c["outcomes"]],
        )
        grid = GridSettings(lengths=[window, target], depths=DEPTHS, trials=trials, seed=seed + 3087)
        options = {"distractors": 2}
        g = evaluate_task_grid(loaded, grid, "multikey", hay, template=0, options=options, show_progress=False)
        res.update(
            mk64=round(100 * g["by_length"][str(window)]["accuracy"]),
            mkT=round(100 * g["by_length"][str(target)]["accuracy"]),
            out_mk=[o for c in g["cells"] for o in c["outcomes"]],
        )
        nll = doc_nll(loaded, window)
        p = paired_ppl_ratio(np.array(nll), np.array(base_nll), np.full(len(nll), window - 1.0), resamples=1000, seed=0)
        res.update(ppl64_vs_base=[round(p[k], 3) for k in ("ratio", "ci_low", "ci_high")], doc_nll64=nll)
        res["eval_s"] = round(time.time() - started)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
