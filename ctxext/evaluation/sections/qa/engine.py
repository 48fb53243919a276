r"""Long-document question answering: greedy answers, SQuAD exact match / F1, bucketed by answer position and length.

Data: a jsonl / json / parquet / csv file or a ``datasets`` set with a context, a question and the
answers (a string, a list of strings, or SQuAD's ``{"text": [...], "answer_start": [...]}``). The
prompt is ``template`` (default ``"{context}\n\nQuestion: {question}\nAnswer:"``), built in tokens: a
context longer than the model's window (minus the question and the answer budget) is truncated in
the middle, keeping its first and last halves (the LongBench convention), and counted. The answer's
position bucket is computed from the tokens actually kept: its token span in the context is mapped
through the truncation onto the kept context (0–20 % … 80–100 % of what the model sees), and an answer
whose tokens were cut out (wholly or partly) goes to its own bucket, ``answer truncated away``, so a
lost-in-the-middle curve never mixes answers the model could not see. The answer is
the greedy continuation up to its first newline. Scores come from ``evaluate`` with the metric module
shipped in ctxext (``metrics/squad_offline``), which loads without a network.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ctxext.errors import InputError
from ctxext.evaluation.sections.qa.settings import QASettings
from ctxext.models.load import LoadedModel
from ctxext.progress import progress
from ctxext.rope.runtime import reset_dynamic_rope
from ctxext.scoring.stats import bootstrap_nll
from ctxext.tasks.base import ChatWrap, encode
from ctxext.tasks.chat import ChatDecision, describe_chat

METRIC_PATH = Path(__file__).parent / "metrics" / "squad_offline" / "squad_offline.py"
POSITION_BUCKETS = 5
TRUNCATED_AWAY = "answer truncated away"
NOT_FOUND = "not found"


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalization (lower-case, no punctuation, no articles, single spaces)."""
    from ctxext.evaluation.sections.qa.metrics.squad_offline.squad_offline import normalize_answer as _norm

    return _norm(text)


def load_metric() -> Any:
    """The offline SQuAD metric as an ``evaluate`` module."""
    import evaluate

    return evaluate.load(str(METRIC_PATH))


def _answers(value: Any) -> list[str]:
    if isinstance(value, dict):
        value = value.get("text", [])
    if isinstance(value, str):
        return [value]
    return [str(v) for v in (value or [])]


def load_examples(settings: QASettings) -> list[dict[str, Any]]:
    """Read (context, question, answers) examples.

    Raises:
        InputError: a missing file, missing columns, or no examples.
    """
    from ctxext.scoring.texts import iter_records

    out = []
    fields = (settings.context_field, settings.question_field, settings.answers_field)
    for row in iter_records(settings.data, settings.split):
        missing = [f for f in fields if f not in row]
        if missing:
            raise InputError(
                f"{settings.data} has no column(s) {', '.join(missing)}; columns: {', '.join(row)} "
                "(use --context-field / --question-field / --answers-field)"
            )
        answers = _answers(row[settings.answers_field])
        start = None
        raw = row[settings.answers_field]
        if isinstance(raw, dict) and raw.get("answer_start"):
            start = int(list(raw["answer_start"])[0])
        out.append(
            {"context": str(row[fields[0]]), "question": str(row[fields[1]]), "answers": answers, "answer_start": start}
        )
        if settings.max_examples and len(out) >= settings.max_examples:
            break
    if not out:
        raise InputError(f"{settings.data} holds no QA examples")
    return out


def truncate_middle(ids: list[int], budget: int) -> tuple[list[int], bool]:
    """Keep the first ``budget // 2`` and the last ``budget − budget // 2`` tokens (LongBench).

    Args:
        ids: context tokens.
        budget: how many may stay.

    Returns:
        ``(ids, truncated)``.
    """
    if len(ids) <= budget:
        return ids, False
    half = budget // 2
    return ids[:half] + ids[len(ids) - (budget - half) :], True


def kept_position(token: int, n_tokens: int, budget: int) -> int | None:
    """Where context token ``token`` lands after :func:`truncate_middle` (None: cut out).

    Args:
        token: index in the full context.
        n_tokens: full context length in tokens.
        budget: tokens kept.

    Returns:
        Its index in the kept context, or None when the truncation removed it.
    """
    if n_tokens <= budget:
        return token
    half = budget // 2
    tail_start = n_tokens - (budget - half)
    if token < half:
        return token
    if token >= tail_start:
        return half + token - tail_start
    return None


def _answer_char_span(example: dict[str, Any]) -> tuple[int, int] | None:
    # The answer's character span in the context: the given answer_start, else its first occurrence.
    ctx = example["context"]
    start = example.get("answer_start")
    answers = [a for a in example["answers"] if a]
    if start is not None and answers:
        return start, start + len(answers[0])
    low = ctx.lower()
    found = sorted((low.find(a.lower()), len(a)) for a in answers if low.find(a.lower()) >= 0)
    if not found:
        return None
    return found[0][0], found[0][0] + found[0][1]


def answer_token_span(tokenizer: Any, context: str, span: tuple[int, int]) -> tuple[int, int]:
    """The context tokens (first, last inclusive) that cover a character span of the context.

    Uses the tokenizer's offsets where it has them (fast tokenizers), else counts the tokens of the
    prefix (BPE merges at the boundary may shift it by one token).

    Args:
        tokenizer: the model's tokenizer.
        context: the context text.
        span: ``(start, end)`` characters.

    Returns:
        ``(first, last)`` token indices, as :func:`build_qa_prompt` tokenizes the context.
    """
    start, end = span
    try:
        enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, ValueError, KeyError):
        offsets = None
    if offsets:
        first = next((i for i, (_, e) in enumerate(offsets) if e > start), len(offsets) - 1)
        last = max(first, next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), first))
        return first, last
    n_before = len(tokenizer(context[:start], add_special_tokens=False, verbose=False)["input_ids"])
    n_through = len(tokenizer(context[:end], add_special_tokens=False, verbose=False)["input_ids"])
    return n_before, max(n_before, n_through - 1)


def _kept_bucket(first: int, last: int, n_tokens: int, budget: int) -> tuple[str, int | None]:
    kept = min(n_tokens, budget)
    a, b = kept_position(first, n_tokens, budget), kept_position(last, n_tokens, budget)
    # Both ends kept on the same side of the cut: the whole answer is visible.
    if a is None or b is None or b - a != last - first:
        return TRUNCATED_AWAY, None
    width = 100 // POSITION_BUCKETS
    k = min(POSITION_BUCKETS - 1, int(100 * a / max(1, kept)) // width)
    return f"{k * width}-{(k + 1) * width}%", a


def build_qa_prompt(
    tokenizer: Any, example: dict[str, Any], template: str, budget: int, chat: ChatWrap | None = None
) -> tuple[list[int], dict]:
    """The prompt's tokens for one example, the context truncated in the middle to fit ``budget``.

    Args:
        tokenizer: the model's tokenizer.
        example: ``context``, ``question``.
        template: with ``{context}`` and ``{question}``.
        budget: total prompt tokens allowed (a chat template's tokens included).
        chat: a chat template's tokens around the prompt (None: a plain prompt).

    Returns:
        ``(ids, info)`` with ``context_tokens``, ``kept_tokens``, ``truncated``, ``position_bucket`` (from
        the kept tokens; ``answer truncated away`` or ``not found``) and ``answer_kept_token`` (the
        answer's first token in the kept context, or None).

    Raises:
        InputError: the question alone does not fit.
    """
    if "{context}" not in template:
        raise InputError("the QA template needs a {context} placeholder")
    pre, post = template.split("{context}", 1)
    pre_text, post_text = pre.format(question=example["question"]), post.format(question=example["question"])
    if chat is None:
        pre_ids = list(tokenizer(pre_text, verbose=False)["input_ids"])
        post_ids = encode(tokenizer, post_text)
    else:  # the template writes its own BOS
        pre_ids, post_ids = chat.head + encode(tokenizer, pre_text), encode(tokenizer, post_text) + chat.tail
    ctx = list(tokenizer(example["context"], add_special_tokens=False, verbose=False)["input_ids"])
    room = budget - len(pre_ids) - len(post_ids)
    if room < 1:
        raise InputError(
            f"a prompt budget of {budget} tokens cannot hold the question ({len(pre_ids) + len(post_ids)})"
        )
    kept, truncated = truncate_middle(ctx, room)
    span = _answer_char_span(example)
    if span is None or not ctx:
        bucket, where = NOT_FOUND, None
    else:
        first, last = answer_token_span(tokenizer, example["context"], span)
        bucket, where = _kept_bucket(first, last, len(ctx), room)
    return pre_ids + kept + post_ids, {
        "context_tokens": len(ctx),
        "kept_tokens": len(kept),
        "truncated": truncated,
        "position_bucket": bucket,
        "answer_kept_token": where,
    }


def _length_bucket(tokens: int, edges: list[int]) -> str:
    lo = 0
    for edge in sorted(edges):
        if tokens < edge:
            return f"{lo}-{edge}"
        lo = edge
    return f"{lo}+"


@torch.no_grad()
def _answer(loaded: LoadedModel, ids: list[int], max_new_tokens: int) -> str:
    from ctxext.evaluation.sections.grids.engine import greedy_generate

    text = greedy_generate(loaded, [ids], max_new_tokens)[0]
    return text.strip().split("\n")[0].strip()


def evaluate_qa(
    loaded: LoadedModel, settings: QASettings, show_progress: bool = True, chat_decision: ChatDecision | None = None
) -> dict[str, Any]:
    """Greedy answers and SQuAD EM / F1 for one model, overall and by bucket.

    Args:
        loaded: the model.
        settings: data, fields, budgets, template.
        show_progress: draw a progress bar.
        chat_decision: ``chat_template: auto`` decided once for every model of a comparison (``None``: per model).

    Returns:
        The ``qa`` section of a report.
    """
    started = time.perf_counter()
    examples = load_examples(settings)
    max_length = settings.prompt_length(loaded.original_length, loaded.context_length)
    budget = max_length - settings.max_new_tokens
    if budget < 8:
        raise InputError(f"a max length of {max_length} leaves no room for a prompt")
    from ctxext.evaluation.sections.grids.engine import model_chat

    chat, chat_reason = model_chat(loaded, settings.chat_template, chat_decision)
    preds, refs, rows = [], [], []
    with progress(f"qa {loaded.name}", len(examples), enabled=show_progress) as advance:
        for ex in examples:
            ids, info = build_qa_prompt(loaded.tokenizer, ex, settings.template, budget, chat)
            pred = _answer(loaded, ids, settings.max_new_tokens)
            preds.append(pred)
            refs.append(ex["answers"])
            rows.append(
                {
                    **info,
                    "prompt_tokens": len(ids),
                    "length_bucket": _length_bucket(info["context_tokens"], settings.length_edges),
                }
            )
            advance(1)
    reset_dynamic_rope(loaded.model)
    scores = load_metric().compute(predictions=preds, references=refs, per_example=True)
    em, f1 = scores["exact_match_per_example"], scores["f1_per_example"]

    def group(key: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label in sorted({r[key] for r in rows}, key=_bucket_order):
            idx = [i for i, r in enumerate(rows) if r[key] == label]
            out[label] = _summary([em[i] for i in idx], [f1[i] for i in idx], settings)
        return out

    return {
        "task": "qa",
        "settings": settings.model_dump(),
        "chat_template": describe_chat(chat),
        "chat_template_reason": chat_reason,
        "examples": len(examples),
        "truncated": sum(r["truncated"] for r in rows),
        "prompt_budget": budget,
        "overall": _summary(em, f1, settings),
        "by_position": group("position_bucket"),
        "by_length": group("length_bucket"),
        "samples": [
            {"question": ex["question"], "answers": ex["answers"], "prediction": p, **r}
            for ex, p, r in list(zip(examples, preds, rows, strict=True))[:5]
        ],
        "seconds": round(time.perf_counter() - started, 3),
    }


def _bucket_order(label: str) -> tuple[int, float]:
    if label == TRUNCATED_AWAY:
        return (1, 0.0)
    if label == NOT_FOUND:
        return (2, 0.0)
    head = label.split("-")[0].rstrip("+%")
    return (0, float(head))


def _summary(em: list[float], f1: list[float], settings: QASettings) -> dict[str, Any]:
    import numpy as np

    n = len(em)
    ones = np.ones(n)
    em_ci = bootstrap_nll(np.array(em), ones)
    f1_ci = bootstrap_nll(np.array(f1), ones)
    return {
        "examples": n,
        "exact_match": float(np.mean(em)) if n else None,
        "f1": float(np.mean(f1)) if n else None,
        "exact_match_ci": list(em_ci),
        "f1_ci": list(f1_ci),
    }
