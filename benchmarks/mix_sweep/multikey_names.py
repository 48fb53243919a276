"""Does a model select a key by its name? Multi-key retrieval inside the window, by kind of name.

    python benchmarks/mix_sweep/multikey_names.py MODEL [DISTRACTORS [SAMPLES]]

Samples of 64 tokens (the grown model's window; no extension involved): ``1 + DISTRACTORS`` needles
``KEY_{name} = {5-digit key}`` (template 0's form) at random places in held-out stdlib code, then
``assert KEY_{target} ==``; teacher-forced, the sample is right when every answer token is the argmax.
Three kinds of name, each with the same seeded draws: two letters a–z (what ``benchmarks/grow_base.py``
trains on), two letters a–j (what ``ctxext.tasks`` draws), and one vocabulary word that stays a single
token after ``KEY_`` (``KEY_path``), so that a name is matched by one token. Prints one JSON line per kind:
fully right, and first answer token right (chance: 1 / (1 + DISTRACTORS)).
"""

import json
import random
import string
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from ctxext.evaluation.data import iter_texts
    from ctxext.evaluation.loading import ModelSpec, load_model
    from ctxext.tasks import Haystack
    from ctxext.tasks.base import encode

    torch.set_num_threads(2)
    path = sys.argv[1]
    distractors, samples = (int(x) for x in (sys.argv[2:] + ["2", "100"][len(sys.argv) - 2 :])[:2])
    loaded = load_model(ModelSpec(path, name="m"), device="cpu")
    tok, model = loaded.tokenizer, loaded.model
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
        right = first = 0
        for _ in range(samples):
            names = rng.sample(pool, distractors + 1)
            keys = [str(rng.randint(10000, 99999)) for _ in names]
            needles = [encode(tok, f"\nKEY_{n} = {k}\n") for n, k in zip(names, keys, strict=True)]
            question, answer = encode(tok, f"\nassert KEY_{names[0]} =="), encode(tok, f" {keys[0]}")
            n_fill = 64 - 1 - sum(map(len, needles)) - len(question) - len(answer)
            body = hay.take(n_fill, rng.randrange(len(hay)))
            cuts = sorted(rng.randrange(n_fill + 1) for _ in needles)
            rng.shuffle(needles)
            ids, at = [tok.bos_token_id], 0
            for cut, needle in zip(cuts, needles, strict=True):
                ids += body[at:cut] + needle
                at = cut
            ids += body[at:] + question
            a0 = len(ids)
            ids += answer
            with torch.no_grad():
                pred = model(torch.tensor([ids])).logits[0, a0 - 1 : len(ids) - 1].argmax(-1).tolist()
            right += pred == answer
            first += pred[0] == answer[0]
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
