"""The needle trials a model misses in one cell, and what it predicts instead (teacher-forced argmax).

    python -m experiments.mix_sweep.misses MODEL LENGTH DEPTH [TRIALS]

Trials are ``needle`` (form t0) samples seeded as in ``qeval.py`` (1234; 50 per cell by default, the trials
``qeval.py`` scores). Per miss: the trial index, the value asked for and its tokens, the argmax prediction at
each answer position given the true prefix, and the needle's span and text.
"""

import argparse


def main(argv: list[str] | None = None) -> None:
    """Print each missed trial of the cell and the count."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="the model folder")
    parser.add_argument("length", type=int, help="the sample length in tokens")
    parser.add_argument("depth", type=float, help="the needle's depth in percent")
    parser.add_argument("trials", type=int, nargs="?", default=50, help="trials (default 50, qeval's)")
    args = parser.parse_args(argv)
    import torch

    from ctxext.evaluation.sections.grids.engine import GridSettings
    from ctxext.tasks.samples import make_samples
    from experiments.mix_sweep._probe import probe_model

    path, length, depth, trials = args.model, args.length, args.depth, args.trials
    loaded, hay = probe_model(path)
    tok = loaded.tokenizer
    settings = GridSettings(lengths=[length], depths=[depth], trials=trials, seed=1234)
    misses = 0
    for i, sample in enumerate(
        make_samples(tok, "needle", hay, length, depth, trials=settings.trials, seed=settings.seed)
    ):
        start, end = sample.answer_span
        with torch.no_grad():
            logits = loaded.model(torch.tensor([sample.ids])).logits[0]
        predicted = logits[start - 1 : end - 1].argmax(-1).tolist()
        gold = sample.ids[start:end]
        if predicted == list(gold):
            continue
        misses += 1
        needle = sample.needle_span or (0, 0)
        print(
            f"trial {i}: asked {tok.decode(gold)!r} {tok.convert_ids_to_tokens(gold)}, predicted "
            f"{tok.decode(predicted)!r} {tok.convert_ids_to_tokens(predicted)}; needle at {needle[0]}-{needle[1]} "
            f"{tok.decode(sample.ids[needle[0] : needle[1]])!r}, answer at {start}"
        )
    print(f"{misses} of {trials} missed")


if __name__ == "__main__":
    main()
