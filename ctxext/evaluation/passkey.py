"""Passkey retrieval (Landmark Attention) and needle in a haystack: accuracy over lengths × depths.

Prompts are built in tokens, so their total length and the needle's depth are exact:

    [task prefix (tokenized with the tokenizer's defaults, BOS included)]
    [filler: the first round(depth/100 · F) filler tokens]
    [needle]
    [the remaining filler tokens]
    [question]

where ``F = length − |prefix| − |needle| − |question|``. Depth 0 % puts the needle right after the
prefix; 100 % right before the question. Each (length, depth) cell runs ``trials`` prompts (seeded
keys for the passkey; seeded haystack offsets for the needle), decodes greedily, and scores:

* passkey: correct if the first number generated equals the key;
* needle: correct if every word of the expected answer (SQuAD normalization) appears in the output.

Accuracies carry 95 % Wilson intervals (exact enough for a handful of trials, and sound at 0 % / 100 %).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.evaluation.loading import LoadedModel
from ctxext.evaluation.perplexity import check_lengths
from ctxext.evaluation.progress import progress_bar
from ctxext.evaluation.stats import wilson_interval
from ctxext.rope import reset_dynamic_rope

PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"

NEEDLE_TEXT = " The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day. "
NEEDLE_QUESTION = "\n\nWhat is the best thing to do in San Francisco? The best thing to do in San Francisco is"
NEEDLE_ANSWER = "eat a sandwich and sit in Dolores Park on a sunny day"


@dataclass
class Prompt:
    """A prompt built in tokens.

    Attributes:
        ids: the token ids (exactly the requested length).
        needle_start: index of the needle's first token.
        needle_end: one past its last token.
        filler_tokens: filler tokens in the prompt (``F``).
        filler_before: filler tokens before the needle (``round(depth/100 · F)``).
        answer: what a correct output contains.
    """

    ids: list[int]
    needle_start: int
    needle_end: int
    filler_tokens: int
    filler_before: int
    answer: str


def _encode(tokenizer: Any, text: str, special: bool = False) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])


def build_prompt(
    tokenizer: Any,
    length: int,
    depth: float,
    filler: Sequence[int],
    needle: str,
    question: str,
    answer: str,
    prefix: str = "",
    filler_offset: int = 0,
) -> Prompt:
    """Assemble a prompt of exactly ``length`` tokens with the needle at ``depth`` percent of the filler.

    Args:
        tokenizer: the model's tokenizer.
        length: total prompt length in tokens.
        depth: needle depth in percent of the filler (0 = start, 100 = end).
        filler: a stream of filler token ids, cycled as needed.
        needle: the text to hide.
        question: the text asking for it (ends the prompt).
        answer: the expected answer (for scoring).
        prefix: task description before the filler (tokenized with the tokenizer's defaults, BOS included).
        filler_offset: where in the filler stream to start.

    Returns:
        The :class:`Prompt`.

    Raises:
        InputError: the length cannot hold the prefix, needle and question, or depth is outside 0–100.
    """
    if not 0 <= depth <= 100:
        raise InputError(f"depth {depth} must be a percentage between 0 and 100")
    if not filler:
        raise InputError("the filler / haystack is empty")
    head = list(tokenizer(prefix, verbose=False)["input_ids"])
    needle_ids = _encode(tokenizer, needle)
    question_ids = _encode(tokenizer, question)
    fixed = len(head) + len(needle_ids) + len(question_ids)
    n_fill = length - fixed
    if n_fill < 0:
        raise InputError(f"length {length} cannot hold the prompt: prefix, needle and question need {fixed} tokens")
    before = round(depth / 100 * n_fill)
    stream = [filler[(filler_offset + i) % len(filler)] for i in range(n_fill)]
    ids = head + stream[:before] + needle_ids + stream[before:] + question_ids
    start = len(head) + before
    return Prompt(ids, start, start + len(needle_ids), n_fill, before, answer)


def filler_stream(tokenizer: Any, text: str, min_tokens: int = 4096) -> list[int]:
    """Token ids of ``text`` repeated until at least ``min_tokens`` (tokenized once, without special tokens).

    Args:
        tokenizer: the tokenizer.
        text: filler text (one period of it).
        min_tokens: how many tokens to produce at least.

    Returns:
        The ids (a whole number of repetitions, so cycling them keeps the text's period).
    """
    one = _encode(tokenizer, text)
    reps = max(1, -(-min_tokens // max(1, len(one))))
    return _encode(tokenizer, text * reps)


def first_number(text: str) -> str | None:
    """The first run of digits in ``text``, or None."""
    match = re.search(r"\d+", text)
    return match.group(0) if match else None


def passkey_correct(output: str, key: int | str) -> bool:
    """Passkey scoring: the first number generated equals the key."""
    return first_number(output) == str(key)


def needle_recall(output: str, answer: str) -> float:
    """Fraction of the answer's words (SQuAD-normalized) present in the output."""
    from ctxext.evaluation.qa import normalize_answer

    want = normalize_answer(answer).split()
    have = set(normalize_answer(output).split())
    return sum(w in have for w in want) / len(want) if want else 0.0


@torch.no_grad()
def greedy_generate(loaded: LoadedModel, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy continuations of equal-length prompts (no padding needed), decoded without special tokens.

    Args:
        loaded: the model.
        prompts: token id lists, all of the same length.
        max_new_tokens: tokens to generate.

    Returns:
        The decoded continuations.
    """
    tok = loaded.tokenizer
    x = torch.tensor(prompts, dtype=torch.long, device=loaded.device)
    reset_dynamic_rope(loaded.model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = loaded.model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad,
    )
    reset_dynamic_rope(loaded.model)
    return [tok.decode(row[x.shape[1] :], skip_special_tokens=True) for row in out.cpu()]


@dataclass
class GridSettings:
    """A retrieval grid.

    Attributes:
        lengths: prompt lengths in tokens.
        depths: needle depths in percent.
        trials: prompts per cell.
        seed: seed of the keys / haystack offsets.
        max_new_tokens: tokens to generate.
        batch_tokens: prompt tokens per generate call (trials of a cell run batched).
        allow_beyond_context: accept lengths above the model's context (marked).
    """

    lengths: list[int]
    depths: list[float] = field(default_factory=lambda: [0, 25, 50, 75, 100])
    trials: int = 5
    seed: int = 0
    max_new_tokens: int = 12
    batch_tokens: int = 32768
    allow_beyond_context: bool = False

    def validate(self) -> None:
        """Raise :class:`InputError` for an empty or malformed grid."""
        if not self.lengths:
            raise InputError("give at least one length")
        if not self.depths:
            raise InputError("give at least one depth")
        bad = [d for d in self.depths if not 0 <= d <= 100]
        if bad:
            raise InputError(f"depths {bad} are outside 0–100 (percent)")
        if self.trials < 1:
            raise InputError("trials must be at least 1")


PromptFn = Callable[[int, float, int], tuple[Prompt, dict[str, Any]]]
ScoreFn = Callable[[str, Prompt], tuple[bool, float]]


def _run_grid(
    loaded: LoadedModel, settings: GridSettings, make: PromptFn, score: ScoreFn, task: str, show: bool
) -> dict[str, Any]:
    settings.validate()
    started = time.perf_counter()
    lengths = sorted({int(x) for x in settings.lengths})
    beyond = check_lengths(loaded, lengths, settings.allow_beyond_context)
    cells: list[dict[str, Any]] = []
    total = len(lengths) * len(settings.depths) * settings.trials
    with progress_bar(f"{task} {loaded.name}", total, show) as advance:
        for L in lengths:
            per_batch = max(1, settings.batch_tokens // L)
            for depth in settings.depths:
                built = [make(L, float(depth), t) for t in range(settings.trials)]
                outputs: list[str] = []
                for i in range(0, len(built), per_batch):
                    batch = [p.ids for p, _ in built[i : i + per_batch]]
                    outputs += greedy_generate(loaded, batch, settings.max_new_tokens)
                    advance(len(batch))
                results = [score(o, p) for o, (p, _) in zip(outputs, built, strict=True)]
                correct = sum(ok for ok, _ in results)
                low, high = wilson_interval(correct, len(results))
                cells.append(
                    {
                        "length": L,
                        "depth": float(depth),
                        "trials": len(results),
                        "correct": int(correct),
                        # Per-trial outcomes (trial order): what paired tests between models need.
                        "trials_correct": [bool(ok) for ok, _ in results],
                        "accuracy": correct / len(results),
                        "score": sum(s for _, s in results) / len(results),
                        "ci_low": low,
                        "ci_high": high,
                        "beyond_context": L in beyond,
                        "examples": [
                            {**meta, "output": out, "correct": ok}
                            for (p, meta), out, (ok, _) in list(zip(built, outputs, results, strict=True))[:2]
                        ],
                    }
                )
    return {
        "task": task,
        "settings": asdict(settings),
        "cells": cells,
        "by_length": _aggregate(cells, "length"),
        "by_depth": _aggregate(cells, "depth"),
        "overall": _aggregate(cells, None)["all"],
        "seconds": round(time.perf_counter() - started, 3),
    }


def _aggregate(cells: list[dict[str, Any]], key: str | None) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        k = "all" if key is None else (str(c[key]) if key == "length" else f"{c[key]:g}")
        groups.setdefault(k, []).append(c)
    out = {}
    for k, cs in groups.items():
        correct = sum(c["correct"] for c in cs)
        trials = sum(c["trials"] for c in cs)
        low, high = wilson_interval(correct, trials)
        out[k] = {"correct": correct, "trials": trials, "accuracy": correct / trials, "ci_low": low, "ci_high": high}
    return out


def evaluate_passkey(loaded: LoadedModel, settings: GridSettings, show_progress: bool = True) -> dict[str, Any]:
    """The passkey retrieval grid of one model.

    Args:
        loaded: the model.
        settings: lengths, depths, trials, seed.
        show_progress: draw a progress bar.

    Returns:
        The ``passkey`` section of a report.
    """
    tok = loaded.tokenizer
    filler = filler_stream(tok, PASSKEY_FILLER)

    def make(length: int, depth: float, trial: int) -> tuple[Prompt, dict[str, Any]]:
        # Keys depend on (seed, length, depth, trial) only: the same grid gets the same keys in any order.
        key = random.Random(f"{settings.seed}-{length}-{depth:g}-{trial}").randint(10000, 99999)
        prompt = build_prompt(
            tok, length, depth, filler, PASSKEY_NEEDLE.format(key=key), PASSKEY_QUESTION, str(key), PASSKEY_PREFIX
        )
        return prompt, {"key": key}

    def score(output: str, prompt: Prompt) -> tuple[bool, float]:
        ok = passkey_correct(output, prompt.answer)
        return ok, float(ok)

    result = _run_grid(loaded, settings, make, score, "passkey", show_progress)
    result["prompt"] = {
        "prefix": PASSKEY_PREFIX,
        "filler": PASSKEY_FILLER,
        "needle": PASSKEY_NEEDLE,
        "question": PASSKEY_QUESTION,
    }
    return result


@dataclass
class NeedleTask:
    r"""What to hide and ask in a needle-in-a-haystack run.

    Attributes:
        haystack: a data source for the haystack text (see :func:`ctxext.evaluation.data.iter_texts`).
        needle: the sentence hidden in it. A needle containing ``{key}`` is *keyed*: every trial draws a
            fresh 5-digit ``{key}`` and a 2-letter ``{name}`` (seeded), formatted into needle, question and
            answer, and is scored like the passkey (first number generated == key). E.g. the in-domain
            code needle ``"\nKEY_{name} = {key}\n"`` / ``"\nassert KEY_{name} =="`` / ``"{key}"``.
        question: the text that ends the prompt and asks for it.
        answer: the expected answer; correct when all its words appear in the output.
        text_field: column of table-like haystack sources.
        split: split of a Hub data set.
        haystack_tokens: how much haystack text to read (tokens).
    """

    haystack: str = "builtin:stdlib"
    needle: str = NEEDLE_TEXT
    question: str = NEEDLE_QUESTION
    answer: str = NEEDLE_ANSWER
    text_field: str = "text"
    split: str = "train"
    haystack_tokens: int | None = None


def evaluate_needle(
    loaded: LoadedModel, settings: GridSettings, task: NeedleTask | None = None, show_progress: bool = True
) -> dict[str, Any]:
    """A needle-in-a-haystack grid of one model.

    Each trial starts the haystack at a different seeded offset, so trials differ in their text.

    Args:
        loaded: the model.
        settings: lengths, depths, trials, seed (``max_new_tokens`` is raised to fit the answer).
        task: haystack source and needle / question / answer.
        show_progress: draw a progress bar.

    Returns:
        The ``needle`` section of a report.
    """
    from ctxext.evaluation.data import iter_texts

    task = task or NeedleTask()
    tok = loaded.tokenizer
    want = task.haystack_tokens or 2 * max(settings.lengths)
    hay: list[int] = []
    for text in iter_texts(task.haystack, task.text_field, task.split):
        hay += _encode(tok, text + "\n\n")
        if len(hay) >= want:
            break
    answer_tokens = len(_encode(tok, " " + task.answer.format(key=99999, name="aa")))
    settings.max_new_tokens = max(settings.max_new_tokens, answer_tokens + 8)

    keyed = "{key}" in task.needle

    def make(length: int, depth: float, trial: int) -> tuple[Prompt, dict[str, Any]]:
        rng = random.Random(f"{settings.seed}-{length}-{depth:g}-{trial}")
        offset = rng.randrange(len(hay))
        fields: dict[str, Any] = {}
        if keyed:
            # A fresh key (and name) per trial, so a model cannot pass by remembering one answer.
            fields = {"key": rng.randint(10000, 99999), "name": "".join(rng.choice("abcdefghij") for _ in range(2))}
        needle, question, answer = (
            t.format(**fields) if keyed else t for t in (task.needle, task.question, task.answer)
        )
        prompt = build_prompt(tok, length, depth, hay, needle, question, answer, "", offset)
        return prompt, {"haystack_offset": offset, **fields}

    def score(output: str, prompt: Prompt) -> tuple[bool, float]:
        if keyed:
            # Keyed needles are scored like the passkey: the first number generated equals the key.
            ok = passkey_correct(output, prompt.answer)
            return ok, float(ok)
        recall = needle_recall(output, prompt.answer)
        return recall >= 1.0, recall

    result = _run_grid(loaded, settings, make, score, "needle", show_progress)
    result["prompt"] = asdict(task) | {"haystack_tokens_read": len(hay)}
    return result
