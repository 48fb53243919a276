"""Synthetic long-range tasks, shared by training (data mixtures) and evaluation (RULER-style suites).

Each task is one module registered by name; given a tokenizer, a haystack, a length, a depth and a
``random.Random`` it returns a :class:`TaskSample` (token ids whose last tokens are the answer, and the
answer's span)::

    import random
    from ctxext.tasks import Haystack, get_task

    hay = Haystack.from_texts(tokenizer, texts, min_tokens=8192)
    s = get_task("multikey").generate(tokenizer, hay, 256, 0.5, random.Random(0), template=0, distractors=3)
    s.ids, s.answer_span   # train with loss on s.ids[s.answer_span[0]:], or score with score_answers

Tasks: ``passkey``, ``needle``, ``multikey``, ``multivalue``, ``multiquery``, ``variable_tracking``,
``common_words``, ``copy_span``, ``json_kv``, ``doc_qa``, ``icl``, ``rerank``, ``mrcr``. Tasks work on token ids
and need only a tokenizer; importing this package does not import torch.
"""

from ctxext.tasks.base import HAYSTACK_MIN_TOKENS, Haystack, Prompt, Task, TaskSample, Template
from ctxext.tasks.registry import get_task, register_task, task_names

__all__ = [
    "HAYSTACK_MIN_TOKENS",
    "Haystack",
    "Prompt",
    "Task",
    "TaskSample",
    "Template",
    "get_task",
    "register_task",
    "task_names",
]
