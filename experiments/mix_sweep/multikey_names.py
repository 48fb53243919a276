"""Does a model select a key by its name? Multi-key retrieval inside the window, by kind of name.

    python -m experiments.mix_sweep.multikey_names MODEL [DISTRACTORS [SAMPLES]]

Samples of 64 tokens (the grown model's window; no extension involved), built by the task registry's prompt
builder (``ctxext.tasks.base.assemble``): ``1 + DISTRACTORS`` needles ``KEY_{name} = {5-digit key}`` (template
0's form) at uniform random depths in held-out stdlib code, then ``assert KEY_{target} ==``; scored
teacher-forced (``score_answers``): right when every answer token is the argmax.
Three kinds of name, each with the same seeded draws: two letters a–z (what ``benchmarks/grow_base.py``
trains on), two letters a–j (what ``ctxext.tasks`` draws), and one vocabulary word that stays a single
token after ``KEY_`` (``KEY_path``), so that a name is matched by one token. Prints one JSON line per kind:
fully right, and first answer token right (chance: 1 / (1 + DISTRACTORS)).
"""

import argparse
import json
import random
import string


def main(argv: list[str] | None = None) -> None:
    """Print one JSON line per kind of name."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="the model folder (or builtin:NAME)")
    parser.add_argument("distractors", type=int, nargs="?", default=2, help="distractor keys (default 2)")
    parser.add_argument("samples", type=int, nargs="?", default=100, help="samples per kind of name (default 100)")
    args = parser.parse_args(argv)
    import torch

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.answers import score_answers
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack
    from ctxext.tasks.base import assemble, encode

    torch.set_num_threads(2)
    path, distractors, samples = args.model, args.distractors, args.samples
    loaded = load_model(ModelSpec(path, name="m"), device="cpu")
    tok = loaded.tokenizer
    hay = Haystack.from_texts(tok, iter_texts("builtin:stdlib"), 50_000, "builtin:stdlib")
    pools = {
        "letters a-z": [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase],
        "letters a-j": [a + b for a in "abcdefghij" for b in "abcdefghij"],
        "one-token words": [
            w for w in sorted(tok.get_vocab()) if w.isascii() and w.isalpha() and w.islower() and 3 <= len(w) <= 7
        ],
    }
    for kind, pool in pools.items():
        rng = random.Random(1)
        built = []
        for _ in range(samples):
            names = rng.sample(pool, distractors + 1)
            keys = [str(rng.randint(10000, 99999)) for _ in names]
            # The needles at independent uniform depths (the registry's prompt builder places them).
            inserts = [(rng.random(), encode(tok, f"\nKEY_{n} = {k}\n")) for n, k in zip(names, keys, strict=True)]
            built.append(
                assemble(
                    tok,
                    task="multikey-names",
                    length=64,
                    depth=inserts[0][0],
                    rng=rng,
                    haystack=hay,
                    prefix="",
                    inserts=inserts,
                    question=encode(tok, f"\nassert KEY_{names[0]} =="),
                    answer=encode(tok, f" {keys[0]}"),
                    answer_text=keys[0],
                    template=None,
                    fields={},
                )
            )
        seqs = [b.ids for b in built]
        right = sum(s.correct for s in score_answers(loaded.model, seqs, [b.answer_span for b in built]))
        firsts = [(b.answer_span[0], b.answer_span[0] + 1) for b in built]
        first = sum(s.correct for s in score_answers(loaded.model, seqs, firsts))
        print(
            json.dumps(
                {
                    "model": path,
                    "names": kind,
                    "distractors": distractors,
                    "samples": samples,
                    "right": right,
                    "first_token_right": first,
                    "chance_first_token": round(samples / (distractors + 1)),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
