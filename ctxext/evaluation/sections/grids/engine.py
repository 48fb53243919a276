"""Retrieval grids (passkey, needle in a haystack, any registered task): accuracy over lengths × depths.

Samples come from the task registry (:mod:`ctxext.tasks`): each is exactly ``length`` tokens, prompt
*and* answer, so a model is scored at the length it is said to be evaluated at::

    [task prefix (BOS included)] [haystack with the needle(s) at their depth] [question] [answer]

Each (length, depth) cell runs ``trials`` samples, seeded by ``(seed, task, length, depth, trial)``
alone, so every model of a comparison sees the same samples (paired trials) in any order.

Scoring (``GridSettings.scoring``, recorded in the report):

* ``teacher-forced`` (default): one forward pass over prompt + answer
  (:func:`ctxext.scoring.answers.score_answers`); correct iff every answer token is the
  argmax at its position — exactly "greedy decoding produces the answer" for static RoPE, with no KV
  cache (which is wrong for ``dynamic`` / ``longrope``, transformers#25104) and no
  ``generation_config`` (a checkpoint's repetition penalty cannot change a number);
* ``generate``: greedy decoding with an explicit :func:`greedy_config` (the checkpoint's
  ``generation_config.json`` is ignored) and no KV cache for length-dependent RoPE, for the answer's
  length plus ``answer_margin`` tokens (at least ``max_new_tokens``). A trial is correct iff the
  generated tokens start with the answer's tokens (the teacher-forced criterion, as a cross-check), and
  every cell also gets RULER's string-match score of the generated text
  (:mod:`ctxext.scoring.string_match`: the task's references found in it, ``all`` or ``part``);
* ``both``: the two on the same trials; the cell's accuracy and outcomes are the teacher-forced ones.

Cells, lengths, depths and the overall entry carry ``teacher_forced`` (correct, trials, accuracy) and
``generated`` (metric, score, trials; cells also the per-trial scores) for what ran. Prompts are
wrapped in a chat template by ``chat_template`` (``auto``: the tokenizer's own where it has one;
:mod:`ctxext.tasks.chat`); the report's ``chat_template`` says which was used.

Accuracies carry 95 % Wilson intervals (exact enough for a handful of trials, and sound at 0 % / 100 %);
every cell lists its per-trial outcomes, for paired tests between models.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ctxext.errors import InputError
from ctxext.evaluation.lengths import check_lengths
from ctxext.evaluation.sections.grids.settings import NeedleSettings, PasskeySettings
from ctxext.models.load import LoadedModel, base_model
from ctxext.progress import progress
from ctxext.rope.runtime import reset_dynamic_rope
from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES
from ctxext.scoring.stats import wilson_interval
from ctxext.tasks import Haystack, TaskSample, Template, get_task
from ctxext.tasks.base import NOISE_TEXT, ChatWrap
from ctxext.tasks.chat import ChatDecision, chat_format, check_chat_template, describe_chat, eos_ids
from ctxext.tasks.samples import make_samples

if TYPE_CHECKING:
    from transformers import GenerationMixin

    from ctxext.evaluation.sections.ruler.settings import RulerSuiteSettings

SCORINGS = ("teacher-forced", "generate", "both")
# Prompt + new tokens per generate call (generation's per-step overhead favours large batches).
GENERATE_BATCH_TOKENS = 32768

NEEDLE_TEXT = " The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day. "
NEEDLE_QUESTION = "\n\nWhat is the best thing to do in San Francisco?"
NEEDLE_ANSWER_PREFIX = " The best thing to do in San Francisco is"
NEEDLE_ANSWER = "eat a sandwich and sit in Dolores Park on a sunny day"


# ---------------------------------------------------------------------------------------------
# Generation (free-form answers, and the cross-check of teacher-forced scoring)
# ---------------------------------------------------------------------------------------------


def greedy_config(tokenizer: Any, max_new_tokens: int, use_cache: bool = True) -> Any:
    """An explicit greedy ``GenerationConfig``: no sampling, beams, repetition penalty or n-gram blocking."""
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        use_cache=use_cache,
    )


@contextlib.contextmanager
def _without_checkpoint_generation_config(model: torch.nn.Module) -> Iterator[None]:
    # transformers fills every field a passed GenerationConfig leaves unset from model.generation_config
    # (the checkpoint's generation_config.json: bad_words_ids, suppress_tokens, min_length …); a blank one
    # for the duration of the call leaves nothing to inherit.
    from transformers import GenerationConfig

    base = base_model(model)
    saved = getattr(base, "generation_config", None)
    base.generation_config = GenerationConfig()
    try:
        yield
    finally:
        if saved is None:  # it had none: leave none behind
            del base.generation_config
        else:
            base.generation_config = saved


@torch.no_grad()
def greedy_generate_ids(loaded: LoadedModel, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (token ids) of equal-length prompts, with :func:`greedy_config`.

    The KV cache is off for length-dependent RoPE (``dynamic`` / ``longrope``): cached keys would keep
    the rotation of the prompt length while the frequencies change (transformers#25104).

    Args:
        loaded: the model.
        prompts: token id lists, all of the same length.
        max_new_tokens: tokens to generate.

    Returns:
        The generated ids of each prompt (shorter where generation stopped at EOS).
    """
    tok = loaded.tokenizer
    x = torch.tensor(prompts, dtype=torch.long, device=loaded.device)
    use_cache = loaded.rope.rope_type not in LENGTH_DEPENDENT_TYPES
    reset_dynamic_rope(loaded.model)
    with _without_checkpoint_generation_config(loaded.model):
        # A causal LM, or its peft wrapper, whose generate takes the same arguments.
        out = cast("GenerationMixin", loaded.model).generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            generation_config=greedy_config(tok, max_new_tokens, use_cache),
        )
    reset_dynamic_rope(loaded.model)
    rows = []
    for row in out[:, x.shape[1] :].cpu().tolist():
        # generate pads rows that stopped at EOS: keep the EOS itself, drop the padding after it.
        if tok.eos_token_id is not None and tok.eos_token_id in row:
            row = row[: row.index(tok.eos_token_id) + 1]
        rows.append(row)
    return rows


def greedy_generate(loaded: LoadedModel, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy continuations of equal-length prompts, decoded without special tokens (:func:`greedy_generate_ids`)."""
    rows = greedy_generate_ids(loaded, prompts, max_new_tokens)
    return [loaded.tokenizer.decode(r, skip_special_tokens=True) for r in rows]


# ---------------------------------------------------------------------------------------------
# Grids
# ---------------------------------------------------------------------------------------------


@dataclass
class GridSettings:
    """A retrieval grid.

    Attributes:
        lengths: sample lengths in tokens (prompt + answer).
        depths: needle depths in percent.
        trials: samples per cell.
        seed: seed of the samples (keys, names, haystack offsets).
        max_new_tokens: generation: tokens generated at least.
        answer_margin: generation: tokens generated beyond the longest answer of a batch (the budget is
            the answer's length plus this, at least ``max_new_tokens``; RULER's fixed budgets are larger).
        batch_tokens: tokens per forward pass / generate call (default: teacher-forced, the scorer's device
            default, :data:`ctxext.scoring.answers.BATCH_TOKENS_CPU` / ``_GPU``; generate, 32768).
        allow_beyond_context: accept lengths above the model's context (marked).
        scoring: ``teacher-forced`` (default), ``generate`` or ``both``.
        chat_template: ``auto`` (the tokenizer's chat template for an instruct model; :mod:`ctxext.tasks.chat`),
            ``tokenizer``, ``none`` or a Jinja file.
        chat_decision: ``auto`` decided once for every model of a comparison (``None``: per model).
    """

    # The defaults are the declared ones (:mod:`.settings`, PasskeySettings): one default each.
    lengths: list[int]
    depths: list[float] = field(default_factory=lambda: _declared("depths"))
    trials: int = field(default_factory=lambda: _declared("trials"))
    seed: int = field(default_factory=lambda: _declared("seed"))
    max_new_tokens: int = field(default_factory=lambda: _declared("max_new_tokens"))
    answer_margin: int = field(default_factory=lambda: _declared("answer_margin"))
    batch_tokens: int | None = None
    allow_beyond_context: bool = field(default_factory=lambda: _declared("allow_beyond_context"))
    scoring: str = field(default_factory=lambda: _declared("scoring"))
    chat_template: str = field(default_factory=lambda: _declared("chat_template"))
    chat_decision: ChatDecision | None = None

    @classmethod
    def from_settings(
        cls,
        settings: PasskeySettings | RulerSuiteSettings,
        lengths: list[int],
        allow_beyond_context: bool,
        chat_decision: ChatDecision | None = None,
    ) -> GridSettings:
        """The grid of a suite's (or a command's) passkey / needle / ruler settings, at lengths resolved in tokens."""
        return cls(
            lengths=lengths,
            depths=list(settings.depths),
            trials=settings.trials,
            seed=settings.seed,
            max_new_tokens=settings.max_new_tokens,
            answer_margin=settings.answer_margin,
            # A section without the key (ruler: the suite's) leaves it to the argument.
            allow_beyond_context=allow_beyond_context or getattr(settings, "allow_beyond_context", False),
            scoring=settings.scoring,
            chat_template=settings.chat_template,
            chat_decision=chat_decision,
        )

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
        if self.scoring not in SCORINGS:
            raise InputError(f"scoring {self.scoring!r}: use {', '.join(SCORINGS)}")
        if self.answer_margin < 0 or self.max_new_tokens < 1:
            raise InputError("answer_margin must be ≥ 0 and max_new_tokens ≥ 1 (generated tokens)")
        check_chat_template(self.chat_template, "chat_template")

    @property
    def teacher_forced(self) -> bool:
        """Whether trials are scored teacher-forced (``teacher-forced`` or ``both``)."""
        return self.scoring in ("teacher-forced", "both")

    @property
    def generates(self) -> bool:
        """Whether trials are generated (``generate`` or ``both``)."""
        return self.scoring in ("generate", "both")


def _declared(name: str) -> Any:
    return PasskeySettings.model_fields[name].get_default(call_default_factory=True)


def model_chat(
    loaded: LoadedModel, choice: str, decided: ChatDecision | None = None, where: str = "chat_template"
) -> tuple[ChatWrap | None, str]:
    """A loaded model's chat template for ``choice`` and why (:func:`ctxext.tasks.chat.chat_format`).

    ``auto`` reads the model's end-of-sequence ids from its config and generation config, unless ``decided``
    (once, for every model of a comparison) says what to use.
    """
    base = base_model(loaded.model)
    stops = eos_ids(loaded.tokenizer, getattr(base, "config", None), getattr(base, "generation_config", None))
    return chat_format(loaded.tokenizer, choice, where, stops, decided)


def _needle_default(name: str) -> Any:
    return NeedleSettings.model_fields[name].get_default(call_default_factory=True)


_OnBatch = Callable[[int], None] | None  # told how many trials each forward pass scored


def _score_generate(
    loaded: LoadedModel,
    samples: list[TaskSample],
    settings: GridSettings,
    on_batch: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    from ctxext.scoring.string_match import postprocess_prediction, sample_metric

    # Prompts of one length run batched (answers of different token lengths give different prompt lengths).
    out: list[dict[str, Any] | None] = [None] * len(samples)
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(len(s.prompt), []).append(i)
    for plen, members in groups.items():
        longest = max(len(samples[i].answer_ids) for i in members)
        n_new = max(settings.max_new_tokens, longest + settings.answer_margin)
        per_batch = max(1, (settings.batch_tokens or GENERATE_BATCH_TOKENS) // (plen + n_new))
        for b in range(0, len(members), per_batch):
            batch = members[b : b + per_batch]
            gens = greedy_generate_ids(loaded, [samples[i].prompt for i in batch], n_new)
            for i, gen in zip(batch, gens, strict=True):
                sample, want = samples[i], samples[i].answer_ids
                task = get_task(sample.task)
                text = loaded.tokenizer.decode(gen, skip_special_tokens=True)
                match = sample_metric(task.metric)(postprocess_prediction(text), task.references(sample))
                out[i] = {"correct": gen[: len(want)] == want, "output": text, "string_match": match}
            if on_batch is not None:
                on_batch(len(batch))
    return [o for o in out if o is not None]


def score_trials(
    loaded: LoadedModel, samples: list[TaskSample], settings: GridSettings, on_batch: _OnBatch = None
) -> list[dict[str, Any]]:
    """Each trial's result: ``correct`` (the primary outcome) and what each scoring that ran measured.

    ``on_batch`` is told how many trials each forward pass (or generation batch) scored, once per scoring.
    """
    tf = _score_teacher_forced(loaded, samples, settings, on_batch) if settings.teacher_forced else None
    gen = _score_generate(loaded, samples, settings, on_batch) if settings.generates else None
    out = []
    for i in range(len(samples)):
        row: dict[str, Any] = {}
        if gen is not None:
            row.update(gen[i], generated_correct=gen[i]["correct"])
        if tf is not None:
            row.update(tf[i], teacher_forced_correct=tf[i]["correct"])  # the primary outcome where it ran
        out.append(row)
    return out


def _score_teacher_forced(
    loaded: LoadedModel, samples: list[TaskSample], settings: GridSettings, on_batch: _OnBatch
) -> list[dict[str, Any]]:
    from ctxext.scoring.answers import score_answers

    ids, spans = [s.ids for s in samples], [s.answer_span for s in samples]
    scores = score_answers(loaded.model, ids, spans, batch_tokens=settings.batch_tokens, on_batch=on_batch)
    return [{"correct": sc.correct, "answer_nll": round(sc.nll, 4)} for sc in scores]


def evaluate_task_grid(
    loaded: LoadedModel,
    settings: GridSettings,
    task: str,
    haystack: Haystack,
    template: int | Template | list[int] = 0,
    options: dict[str, int] | None = None,
    show_progress: bool = True,
    label: str | None = None,
) -> dict[str, Any]:
    """Accuracy of one model on one registered task over lengths × depths.

    Args:
        loaded: the model.
        settings: lengths, depths (percent), trials, seed, scoring.
        task: a registered task name (:func:`ctxext.tasks.task_names`).
        haystack: the filler.
        template: a template index, a list of them (cycled over trials), or a custom
            :class:`~ctxext.tasks.Template`.
        options: task options (e.g. ``{"distractors": 3}``).
        show_progress: draw a progress bar.
        label: the section name (default: the task name).

    Returns:
        The grid section of a report: cells (with per-trial ``outcomes``), by length, by depth, overall.

    Raises:
        InputError: a bad grid, lengths beyond the context, or a length too short for the task.
    """
    settings.validate()
    started = time.perf_counter()
    lengths = sorted({int(x) for x in settings.lengths})
    beyond = check_lengths(loaded, lengths, settings.allow_beyond_context)
    chat, chat_reason = model_chat(loaded, settings.chat_template, settings.chat_decision)
    metric = get_task(task).metric
    cells: list[dict[str, Any]] = []
    # Counted per forward pass (once per scoring that runs), so a length of long trials shows progress too.
    scorings = int(settings.teacher_forced) + int(settings.generates)
    total = len(lengths) * len(settings.depths) * settings.trials * scorings
    with progress(f"{label or task} {loaded.name}", total, enabled=show_progress) as advance:
        for L in lengths:
            # Every sample of a length is built first, so the scorer batches across depths too.
            built = [
                (
                    float(d),
                    make_samples(
                        loaded.tokenizer,
                        task,
                        haystack,
                        L,
                        float(d),
                        trials=settings.trials,
                        seed=settings.seed,
                        template=template,
                        options=options,
                        chat=chat,
                    ),
                )
                for d in settings.depths
            ]
            flat = [s for _, samples in built for s in samples]
            results = score_trials(loaded, flat, settings, advance)
            at = 0
            for depth, samples in built:
                res = results[at : at + len(samples)]
                at += len(samples)
                cells.append(_cell(L, depth, samples, res, L in beyond, metric))
    return {
        "task": label or task,
        "registry_task": task,
        "template": asdict(template) if isinstance(template, Template) else template,
        "options": dict(options or {}),
        "haystack": haystack.name,
        "scoring": settings.scoring,
        "chat_template": describe_chat(chat),
        "chat_template_reason": chat_reason,
        "settings": asdict(settings),
        "cells": cells,
        "by_length": _aggregate(cells, "length"),
        "by_depth": _aggregate(cells, "depth"),
        "overall": _aggregate(cells, None)["all"],
        "seconds": round(time.perf_counter() - started, 3),
    }


def _cell(
    length: int, depth: float, samples: list[TaskSample], results: list[dict[str, Any]], beyond: bool, metric: str
) -> dict[str, Any]:
    outcomes = [int(r["correct"]) for r in results]
    correct = sum(outcomes)
    low, high = wilson_interval(correct, len(outcomes))
    cell: dict[str, Any] = {
        "length": length,
        "depth": depth,
        "trials": len(outcomes),
        "correct": correct,
        "accuracy": correct / len(outcomes),
        "score": correct / len(outcomes),
        "ci_low": low,
        "ci_high": high,
        "beyond_context": beyond,
        "outcomes": outcomes,
    }
    if "teacher_forced_correct" in results[0]:
        cell["teacher_forced"] = _tf_summary([int(r["teacher_forced_correct"]) for r in results])
    if "string_match" in results[0]:
        cell["generated"] = _generated_summary([r["string_match"] for r in results], metric, keep=True)
    hidden = ("teacher_forced_correct", "generated_correct")
    cell["examples"] = [
        {**s.fields, "answer": s.answer, **{k: v for k, v in r.items() if k not in hidden}}
        for s, r in list(zip(samples, results, strict=True))[:2]
    ]
    return cell


def _tf_summary(outcomes: list[int]) -> dict[str, Any]:
    return {"correct": sum(outcomes), "trials": len(outcomes), "accuracy": sum(outcomes) / len(outcomes)}


def _generated_summary(scores: list[float], metric: str, keep: bool = False) -> dict[str, Any]:
    # RULER's number for these trials: the mean per-trial string match (a fraction here, ×100 in RULER).
    out: dict[str, Any] = {
        "metric": f"string_match_{metric}",
        "score": sum(scores) / len(scores),
        "trials": len(scores),
    }
    if keep:
        out["scores"] = [round(x, 6) for x in scores]
    return out


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
        agg = {"correct": correct, "trials": trials, "accuracy": correct / trials, "ci_low": low, "ci_high": high}
        if "teacher_forced" in cs[0]:
            agg["teacher_forced"] = _tf_summary([o for c in cs for o in _tf_outcomes(c)])
        if "generated" in cs[0]:
            metric = cs[0]["generated"]["metric"].removeprefix("string_match_")
            agg["generated"] = _generated_summary([x for c in cs for x in c["generated"]["scores"]], metric)
        out[k] = agg
    return out


def _tf_outcomes(cell: dict[str, Any]) -> list[int]:
    tf = cell["teacher_forced"]
    return [1] * tf["correct"] + [0] * (tf["trials"] - tf["correct"])


def evaluate_passkey(
    loaded: LoadedModel, settings: GridSettings, show_progress: bool = True, template: int = 0
) -> dict[str, Any]:
    """The passkey retrieval grid of one model (the ``passkey`` task in the noise haystack).

    Args:
        loaded: the model.
        settings: lengths, depths, trials, seed, scoring.
        show_progress: draw a progress bar.
        template: the passkey task's template (0: the Landmark Attention prompt).

    Returns:
        The ``passkey`` section of a report.
    """
    hay = Haystack.noise(loaded.tokenizer)
    result = evaluate_task_grid(loaded, settings, "passkey", hay, template, None, show_progress)
    result["prompt"] = {**asdict(get_task("passkey").templates[template]), "filler": NOISE_TEXT}
    return result


@dataclass
class NeedleTask:
    r"""What to hide and ask in a needle-in-a-haystack run.

    Attributes:
        haystack: a data source for the haystack text (see :func:`ctxext.scoring.texts.iter_texts`).
        needle: the sentence hidden in it. A needle containing ``{key}`` is *keyed*: every trial draws a
            fresh 5-digit ``{key}`` and a 2-letter ``{name}`` (seeded), formatted into needle, question and
            answer. E.g. the in-domain code needle ``"\nKEY_{name} = {key}\n"`` / ``"\nassert KEY_{name} =="``
            / ``"{key}"``.
        question: the text after the haystack that asks for it.
        answer_prefix: the text that starts the answer (with a chat template: the assistant's first words);
            ``None``: the built-in question's (" The best thing to do in San Francisco is") with that question,
            nothing with any other (its question then ends the prompt, as the code forms' ``assert KEY_ab ==``).
        answer: the expected continuation of the answer prefix; a space is put before it unless the question and
            answer prefix end in whitespace or the answer starts with it.
        text_field: column of table-like haystack sources.
        split: split of a Hub data set.
        haystack_tokens: how much haystack text to read (tokens).
        template: use the ``needle`` task's registered template of this index instead of needle /
            question / answer.
    """

    haystack: str = field(default_factory=lambda: _needle_default("haystack"))
    needle: str = NEEDLE_TEXT
    question: str = NEEDLE_QUESTION
    answer_prefix: str | None = None
    answer: str = NEEDLE_ANSWER
    text_field: str = field(default_factory=lambda: _needle_default("text_field"))
    split: str = field(default_factory=lambda: _needle_default("split"))
    haystack_tokens: int | None = None
    template: int | None = None

    @classmethod
    def from_settings(cls, settings: NeedleSettings) -> NeedleTask:
        """The needle of a suite's (or a command's) needle settings (``None``: the built-in needle's)."""
        task = cls(haystack=settings.haystack, text_field=settings.text_field, split=settings.split)
        for name in ("needle", "question", "answer"):
            if getattr(settings, name):
                setattr(task, name, getattr(settings, name))
        task.answer_prefix = settings.answer_prefix
        return task

    def to_template(self) -> int | Template:
        """The registry template (an index) or a custom one built from needle / question / answer prefix / answer."""
        if self.template is not None:
            return self.template
        prefix = self.answer_prefix
        if prefix is None:  # the built-in prefix answers the built-in question only
            prefix = NEEDLE_ANSWER_PREFIX if self.question == NEEDLE_QUESTION else ""
        answer = self.answer
        if not (self.question + prefix)[-1:].isspace() and not answer[:1].isspace():
            answer = " " + answer
        return Template(needle=self.needle, question=self.question, answer_prefix=prefix, answer=answer)


def load_haystack(loaded: LoadedModel, source: str, text_field: str, split: str, tokens: int) -> Haystack:
    """A text haystack of at least ``tokens`` tokens from a data source (``noise`` for the noise filler)."""
    return text_haystack(loaded.tokenizer, source, text_field, split, tokens)


def text_haystack(tokenizer: Any, source: str, text_field: str, split: str, tokens: int) -> Haystack:
    """:func:`load_haystack` for a tokenizer alone."""
    from ctxext.scoring.texts import iter_texts

    if source == "noise":
        return Haystack.noise(tokenizer, tokens)
    return Haystack.from_texts(tokenizer, iter_texts(source, text_field, split), tokens, source)


def evaluate_needle(
    loaded: LoadedModel, settings: GridSettings, task: NeedleTask | None = None, show_progress: bool = True
) -> dict[str, Any]:
    """A needle-in-a-haystack grid of one model (the ``needle`` task).

    Each trial starts the haystack at a different seeded offset, so trials differ in their text.

    Args:
        loaded: the model.
        settings: lengths, depths, trials, seed, scoring.
        task: haystack source and needle / question / answer (or a registry template).
        show_progress: draw a progress bar.

    Returns:
        The ``needle`` section of a report.
    """
    task = task or NeedleTask()
    hay = load_haystack(
        loaded, task.haystack, task.text_field, task.split, task.haystack_tokens or 2 * max(settings.lengths)
    )
    result = evaluate_task_grid(loaded, settings, "needle", hay, task.to_template(), None, show_progress)
    result["prompt"] = asdict(task) | {"haystack_tokens_read": len(hay)}
    return result
