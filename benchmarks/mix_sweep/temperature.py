"""Attention temperature probe: needle retrieval of a model with its attention logits multiplied by ``t``.

    python benchmarks/mix_sweep/temperature.py MODEL LENGTH:DEPTH[,LENGTH:DEPTH …] T[,T …] [TRIALS]
    python benchmarks/mix_sweep/temperature.py MODEL ppl:LENGTH T[,T …]
    BASE=BASE python benchmarks/mix_sweep/temperature.py MODEL ratio:WINDOW:TARGET T[,T …]

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

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    from benchmarks._common import probe_model
    from ctxext.evaluation.sections.grids.engine import GridSettings
    from ctxext.models.temperature import set_attention_temperature
    from ctxext.scoring.answers import score_answers
    from ctxext.scoring.stats import mcnemar_exact
    from ctxext.tasks.samples import make_samples

    path = sys.argv[1]
    cells = [c.split(":") for c in sys.argv[2].split(",")]
    temps = [float(t) for t in sys.argv[3].split(",")]
    trials = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    loaded, hay = probe_model(path)

    def use(t: float) -> None:
        set_attention_temperature(loaded.model, t)

    for kind, size, *rest in cells:
        if kind == "ppl":
            ppl_cell(loaded, int(size), temps, use)
            continue
        if kind == "ratio":
            ratio_cell(loaded, int(size), int(rest[0]), temps, use)
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
    from benchmarks._common import document_nll, stdlib_documents

    docs = stdlib_documents(loaded.tokenizer, length)
    for t in temps:
        use(t)
        nll = document_nll(loaded.model, docs, length)
        parts = {"all": nll, "last quarter": nll[:, -(length // 4) :], "first 128": nll[:, :127]}
        shown = "  ".join(f"{k} {math.exp(float(v.mean())):.3f}" for k, v in parts.items())
        print(f"{loaded.name} ppl of {length} tokens, t={t:g}: {shown}", flush=True)


def ratio_cell(loaded, window: int, target: int, temps: list[float], use) -> None:
    """In-window perplexity ratio to the unpatched ``BASE`` per ``t``, on ``qeval.py``'s documents."""
    import os

    import numpy as np

    from benchmarks._common import document_nll, stdlib_documents
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.stats import paired_ppl_ratio

    docs = stdlib_documents(loaded.tokenizer, target)

    def nll(model) -> np.ndarray:
        return document_nll(model, docs, window).sum(dim=1).double().numpy()

    base = nll(load_model(ModelSpec(os.environ["BASE"], name="base"), device="cpu").model)
    for t in temps:
        use(t)
        r = paired_ppl_ratio(nll(loaded.model), base, np.full(len(docs), window - 1.0), resamples=1000, seed=0)
        print(
            f"{loaded.name} ppl@{window} / base, t={t:g}: {r['ratio']:.3f} ({r['ci_low']:.3f}–{r['ci_high']:.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
