"""Does a model look keys up by name? Multi-key retrieval with one-token values, against chance.

The registry's ``multikey`` task asks for a 5-digit key (4–5 tokens on the grown model's tokenizer), so
a model that copies digits from the wrong key, or mixes two keys, fails for reasons other than lookup.
This probe isolates the lookup: the same ``KEY_{name} = {value}`` needles (template 0's form) in held-out
stdlib source, but every value is one token (`` 0`` … `` 8``), so the answer is one argmax. For each
sample it records whether the argmax is the target's value, and whether it is *any* of the sample's values
(the model copies a value from the context, right or wrong). A model that copies one of the ``n`` values
at random scores ``1/n``: accuracy at that level with "copies a value" near 100 % means it copies without
looking up the name.

    nice -n 5 python -m benchmarks.multikey_probe -m builtin:grown-code-64 -m runs/demo/finetuned
"""

from __future__ import annotations

import argparse
import random


def _samples(tok, hay, length: int, distractors: int, trials: int, seed: int):
    from ctxext.tasks.base import draw_names, encode

    values = [v for v in (f" {d}" for d in range(10)) if len(encode(tok, v)) == 1]
    if len(values) < distractors + 1:
        raise SystemExit(f"only {len(values)} one-token values for {distractors + 1} keys")
    rng = random.Random(f"{seed}-{length}-{distractors}")
    out = []
    for _ in range(trials):
        names, vals = draw_names(rng, distractors + 1), rng.sample(values, distractors + 1)
        needles = [encode(tok, f"\nKEY_{n} ={v}\n") for n, v in zip(names, vals, strict=True)]
        question = encode(tok, f"\nassert KEY_{names[0]} ==")
        n_fill = length - 1 - sum(map(len, needles)) - len(question) - 1
        filler = hay.take(n_fill, rng.randrange(len(hay)))
        cuts = sorted(rng.randrange(n_fill + 1) for _ in needles)
        order = list(range(len(needles)))
        rng.shuffle(order)
        ids, at = [tok.bos_token_id], 0
        for cut, i in zip(cuts, order, strict=True):
            ids += filler[at:cut] + needles[i]
            at = cut
        ids += filler[at:] + question
        out.append((ids, [encode(tok, v)[0] for v in vals]))
    return out


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", action="append", required=True)
    parser.add_argument("--lengths", default="64")
    parser.add_argument("--distractors", default="0,1,2,3")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    from ctxext.evaluation.sections.grids.engine import load_haystack
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.answers import score_answers

    torch.set_num_threads(1)
    print("| model | length | distractors | target value (accuracy) | chance (1/n) | copies one of the values |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ref in args.model:
        lm = load_model(ModelSpec(ref), device="cpu")
        hay = load_haystack(lm, "builtin:stdlib", "text", "test", 8192)
        for length in (int(x) for x in args.lengths.split(",")):
            for nd in (int(x) for x in args.distractors.split(",")):
                samples = _samples(lm.tokenizer, hay, length, nd, args.trials, args.seed)
                # Score every value as the answer: the prompt is the same, so exactly the argmax is "correct".
                seqs = [ids + [v] for ids, vals in samples for v in vals]
                spans = [(len(ids), len(ids) + 1) for ids, vals in samples for _ in vals]
                hits = [s.correct for s in score_answers(lm.model, seqs, spans)]
                target = copied = at = 0
                for _, vals in samples:
                    target += hits[at]
                    copied += any(hits[at : at + len(vals)])
                    at += len(vals)
                n = len(samples)
                print(f"| {ref} | {length} | {nd} | {target}/{n} | {100 / (nd + 1):.0f} % | {copied}/{n} |", flush=True)


if __name__ == "__main__":
    main()
