"""Why multi-key retrieval fails: where the first answer token comes from, and whether the rest follows.

    python -m experiments.mix_sweep.multikey_diag MODEL [LENGTH [SAMPLES [DISTRACTORS]]]

On ``multikey`` samples (form t0, ``KEY_xy = 12345``) inside the window by default, teacher-forced:
the share of samples fully right; whether the first predicted answer token is the target key's first
token, a distractor's, or neither; and whether the remaining answer tokens are right given the true
prefix (copying on after the first token). Also split by whether the target's name is one token.
"""

import argparse
import collections
import json
import random


def main(argv: list[str] | None = None) -> None:
    """Print one JSON line of counts."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="the model folder")
    parser.add_argument("length", type=int, nargs="?", default=64, help="sample length in tokens (default 64)")
    parser.add_argument("samples", type=int, nargs="?", default=200, help="samples (default 200)")
    parser.add_argument("distractors", type=int, nargs="?", default=2, help="distractor keys (default 2)")
    args = parser.parse_args(argv)
    import torch

    from ctxext.tasks import get_task
    from experiments.mix_sweep._probe import probe_model

    path, length, n, distractors = args.model, args.length, args.samples, args.distractors
    loaded, hay = probe_model(path, 50_000)
    tok, model = loaded.tokenizer, loaded.model
    one_token = len(tok.encode("\nKEY_ab =", add_special_tokens=False))
    task, rng = get_task("multikey"), random.Random(7)
    counts: collections.Counter = collections.Counter()
    for _ in range(n):
        s = task.generate(tok, hay, length, rng.random(), rng, template=0, distractors=distractors)
        a0, a1 = s.answer_span
        with torch.no_grad():
            pred = model(torch.tensor([s.ids[:a1]])).logits[0, a0 - 1 : a1 - 1].argmax(-1).tolist()
        gold = s.ids[a0:a1]
        others = [tok.encode(f" {k}", add_special_tokens=False)[0] for k in s.fields["distractors"].values()]
        first = "target" if pred[0] == gold[0] else "distractor" if pred[0] in others else "neither"
        name_ids = tok.encode(f"\nKEY_{s.fields['name']} =", add_special_tokens=False)
        name_kind = "1" if len(name_ids) == one_token else "2"
        counts["correct"] += pred == gold
        counts[f"first token from {first}"] += 1
        counts["rest right given the true first token"] += pred[1:] == gold[1:]
        counts[f"name of {name_kind} token(s)"] += 1
        counts[f"correct, name of {name_kind} token(s)"] += pred == gold
    print(json.dumps({"model": path, "length": length, "samples": n, "distractors": distractors, **counts}))


if __name__ == "__main__":
    main()
