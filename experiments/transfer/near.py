"""Where a fine-tune misses a key (by default the one before the question): its rate by length, and what it copies.

    python -m experiments.transfer.near runs/transfer/experiments-heldout-llama-96 --arm default --seed 0
    python -m experiments.transfer.near runs/transfer/grown-mistral-128 --arm default --seed 1 --temperatures 1 1.1

The evaluation's depth 100 % (``experiments.transfer.run``: needle form 0, the seed's prompts, the stdlib
haystack): the needle about ten tokens before the question, after a prefix of filler that grows with the length;
``--depth`` asks at another of its depths (0 % puts the needle first, the filler between it and the question).
For each attention temperature (the logits' factor; 1 is the run's own) and each length (by default the window and
2, 3, 4 times it), the teacher-forced rate over ``--trials`` prompts, then, at the longest length, the misses: the
needle, the text before it, the answer and the greedy tokens the model gives instead. A miss of a copied digit
(``80828`` → ``50828``) is a copy error; a value from elsewhere in the input is a wrong key.
"""

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Score one depth's prompts of one arm's seed at growing lengths and show the misses."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", help="a base's folder from experiments.transfer.run (holds llama3/ and ARM-sSEED/)")
    parser.add_argument("--arm", default="default", help="the arm")
    parser.add_argument("--seed", type=int, default=0, help="the training seed (its prompts)")
    parser.add_argument("--depth", type=float, default=100.0, help="the needle's depth in %% (the evaluation's 0-100)")
    parser.add_argument("--trials", type=int, default=100, help="prompts per length")
    parser.add_argument("--lengths", type=int, nargs="*", help="lengths (default: 1-4 times the window)")
    parser.add_argument("--temperatures", type=float, nargs="*", default=[1.0], help="attention temperatures")
    parser.add_argument("--show", type=int, default=12, help="misses shown at the longest length")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.models.temperature import set_attention_temperature
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack
    from ctxext.tasks.samples import make_samples
    from experiments.transfer.run import prompt_seed

    torch.set_num_threads(1)
    folder = Path(args.folder)
    window = json.loads((folder / f"{args.arm}.json").read_text())["window"]
    lengths = sorted(args.lengths or [window * k for k in (1, 2, 3, 4)])  # the misses shown are the last, longest
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "llama3"))
    haystack = Haystack.from_texts(tokenizer, iter_texts("builtin:stdlib"), 200_000, "builtin:stdlib")
    model = load_model(ModelSpec(str(folder / f"{args.arm}-s{args.seed}"), name=args.arm), device="cpu").model.eval()
    for t in args.temperatures:
        set_attention_temperature(model, t)
        rates = []
        for length in lengths:
            samples = make_samples(
                tokenizer,
                "needle",
                haystack,
                length,
                args.depth,
                trials=args.trials,
                seed=prompt_seed(args.seed),
                template=0,
            )
            correct, misses = 0, []
            for s in samples:
                with torch.no_grad():
                    logits = model(torch.tensor([s.ids])).logits[0]
                a, b = s.answer_span
                greedy = logits[a - 1 : b - 1].argmax(-1).tolist()
                correct += greedy == s.ids[a:b]
                if greedy != s.ids[a:b] and s.needle_span is not None:
                    ns, ne = s.needle_span
                    before = tokenizer.decode(s.ids[max(0, ns - 8) : ns])
                    misses.append(
                        f"  {tokenizer.decode(s.ids[ns:ne]).strip()!r} after {before!r}: "
                        f"{tokenizer.decode(s.ids[a:b]).strip()!r} → {tokenizer.decode(greedy).strip()!r} "
                        f"({a - ne} tokens from the needle's end)"
                    )
            rates.append(f"{length}: {correct}/{len(samples)}")
        print(f"temperature {t:g}, depth {args.depth:g} %: " + " · ".join(rates), flush=True)
        if t == args.temperatures[-1]:
            print("\n".join(misses[: args.show]))


if __name__ == "__main__":
    main()
