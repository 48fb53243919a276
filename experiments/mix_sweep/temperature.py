"""Attention temperature probe: needle retrieval of a model with its attention logits multiplied by ``t``.

    python -m experiments.mix_sweep.temperature MODEL LENGTH:DEPTH[,LENGTH:DEPTH …] T[,T …] [TRIALS]
    python -m experiments.mix_sweep.temperature MODEL ppl:LENGTH T[,T …]
    BASE=BASE python -m experiments.mix_sweep.temperature MODEL ratio:WINDOW:TARGET T[,T …]

Every attention module's ``scaling`` is multiplied by ``t`` (``ctxext.models.temperature``, what ``ctxext
calibrate`` measures and a calibrated run loads with), so every query-key logit is multiplied by ``t``. The
factor is absolute: a calibrated run's own temperature is replaced, not compounded. (Session 6 scaled the
rotary ``attention_scaling`` by ``sqrt(t)`` instead: the same for full-rotary models, only the rotary quarter
of each head for NeoX.) Trials are
teacher-forced ``needle`` (form t0) samples seeded as in ``qeval.py`` (1234), 100 per cell by default, the
same trials for every ``t``: one line per cell, correct trials per ``t`` and, for each ``t`` after the first,
the discordant trials against the first (``+a/−b``) with the exact McNemar p. A ``ppl:LENGTH`` cell is the
perplexity of the first ``LENGTH`` tokens of 32 stdlib documents (as ``qeval.py`` reads them), over all
positions, the last quarter and the first 128, per ``t``. A ``ratio:WINDOW:TARGET`` cell is ``qeval.py``'s
in-window perplexity ratio to the unpatched ``BASE`` (the first ``WINDOW`` tokens of 32 documents of at least
``TARGET`` tokens, 95 % paired bootstrap), per ``t``.
"""

import argparse
import math
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Print one line per cell (and per temperature for the perplexity cells)."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="the model folder")
    parser.add_argument("cells", help="LENGTH:DEPTH, ppl:LENGTH or ratio:WINDOW:TARGET cells, comma-separated")
    parser.add_argument("temperatures", help="temperatures t, comma-separated; the first is the paired reference")
    parser.add_argument("trials", type=int, nargs="?", default=100, help="needle trials per cell (default 100)")
    parser.add_argument("--base", default=os.environ.get("BASE"), help="the unpatched base of ratio cells (env BASE)")
    args = parser.parse_args(argv)
    from ctxext.evaluation.sections.grids.engine import GridSettings
    from ctxext.models.temperature import set_attention_temperature
    from ctxext.scoring.answers import score_answers
    from ctxext.scoring.stats import mcnemar_exact
    from ctxext.tasks.samples import make_samples
    from experiments.mix_sweep._probe import probe_model

    path = args.model
    cells = [c.split(":") for c in args.cells.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    trials = args.trials
    if any(c[0] == "ratio" for c in cells) and not args.base:
        parser.error("a ratio:WINDOW:TARGET cell needs --base (or BASE): the unpatched base")
    loaded, hay = probe_model(path)

    def use(t: float) -> None:
        set_attention_temperature(loaded.model, t)

    for kind, size, *rest in cells:
        if kind == "ppl":
            ppl_cell(loaded, int(size), temps, use)
            continue
        if kind == "ratio":
            ratio_cell(loaded, args.base, int(size), int(rest[0]), temps, use)
            continue
        length, depth = int(kind), int(size)
        settings = GridSettings(lengths=[length], depths=[depth], trials=trials, seed=1234)
        samples = make_samples(
            loaded.tokenizer, "needle", hay, length, depth, trials=settings.trials, seed=settings.seed
        )
        outcomes = []
        for t in temps:
            use(t)
            scores = score_answers(loaded.model, [x.ids for x in samples], [x.answer_span for x in samples])
            outcomes.append([bool(x.correct) for x in scores])
        shown = []
        for t, got in zip(temps, outcomes, strict=True):
            test = mcnemar_exact(got, outcomes[0])
            paired = (
                f" (+{test['only_a']}/−{test['only_b']}, p = {test['p_value']:.2g})" if got is not outcomes[0] else ""
            )
            shown.append(f"t={t:g}: {sum(got)}/{trials}{paired}")
        print(f"{Path(path).name} {length} tokens, depth {depth}: {'  '.join(shown)}", flush=True)


def ppl_cell(loaded, length: int, temps: list[float], use) -> None:
    """Perplexity of the first ``length`` tokens of 32 stdlib documents per ``t``: all, last quarter, first 128."""
    from experiments.mix_sweep._probe import document_nll, stdlib_documents

    docs = stdlib_documents(loaded.tokenizer, length)
    for t in temps:
        use(t)
        nll = document_nll(loaded.model, docs, length)
        parts = {"all": nll, "last quarter": nll[:, -(length // 4) :], "first 128": nll[:, :127]}
        shown = "  ".join(f"{k} {math.exp(float(v.mean())):.3f}" for k, v in parts.items())
        print(f"{loaded.name} ppl of {length} tokens, t={t:g}: {shown}", flush=True)


def ratio_cell(loaded, base_path: str, window: int, target: int, temps: list[float], use) -> None:
    """In-window perplexity ratio to the unpatched base per ``t``, on ``qeval``'s documents."""
    import numpy as np

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.stats import paired_ppl_ratio
    from experiments.mix_sweep._probe import document_nll, stdlib_documents

    docs = stdlib_documents(loaded.tokenizer, target)

    def nll(model) -> np.ndarray:
        return document_nll(model, docs, window).sum(dim=1).double().numpy()

    base = nll(load_model(ModelSpec(base_path, name="base"), device="cpu").model)
    for t in temps:
        use(t)
        r = paired_ppl_ratio(nll(loaded.model), base, np.full(len(docs), window - 1.0), resamples=1000, seed=0)
        print(
            f"{loaded.name} ppl@{window} / base, t={t:g}: {r['ratio']:.3f} ({r['ci_low']:.3f}–{r['ci_high']:.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
