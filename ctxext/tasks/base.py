"""The pieces every synthetic task shares: templates, haystacks, samples, and the one prompt assembler.

A task sample is a token sequence of exactly ``length`` tokens::

    [prefix (tokenized with the tokenizer's defaults, BOS included)]
    [haystack filler, with the task's inserts (needles) placed at their depths]
    [question + answer prefix (one string, tokenized together)]
    [answer]

With a chat template (:class:`ChatWrap`) the question ends the user's turn and the answer prefix opens the
assistant's (RULER's layout: "What is the pass key?" asked, "The pass key is" answered)::

    [template head] [prefix] [haystack with inserts] [question] [template tail] [answer prefix] [answer]

The answer's tokens are the last ones, at ``answer_span``; a model is scored (or trained) on them
teacher-forced (:func:`ctxext.scoring.answers.score_answers`). ``F = length − |prefix| −
|inserts| − |question| − |answer|`` filler tokens are taken from the haystack at a seeded offset; an
insert at depth ``d`` goes after the first ``round(d · F)`` of them (``d = 0``: right after the prefix;
``d = 1``: right before the question).
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ctxext.errors import InputError

# The noise haystack (Landmark Attention's passkey filler): repetitive, so only the needle carries information.
NOISE_TEXT = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# Keys are 5-digit numbers and names 2 letters of a–j: short, and made of pieces every byte-level BPE
# vocabulary has (the grown model's 2048-token tokenizer splits " 12345" into " 1", "23", "4", "5").
NAME_LETTERS = "abcdefghij"
KEY_RANGE = (10000, 99999)


@dataclass(frozen=True)
class Template:
    """One surface form of a task; which fields each string receives is documented by the task.

    Attributes:
        needle: the text hidden in the haystack (formatted per insert, e.g. with ``{name}`` / ``{key}``).
        question: the text after the haystack that asks for the answer (empty for code forms, whose answer
            prefix is the whole ask: ``assert KEY_ab ==``).
        answer_prefix: the text that starts the answer (``" The pass key is"``), formatted with the question's
            fields. A plain prompt is question + answer prefix as one string; with a chat template the
            question ends the user's turn and the answer prefix (without its leading whitespace) opens the
            assistant's, so the model writes the answer where both scorings read it.
        answer: the exact continuation scored (or trained on); it follows the answer prefix verbatim, so it
            carries its own leading space where one belongs.
        stop: the texts that end an answer in this form (what follows it in the needle: ``"."``, a newline, a
            closing bracket); a generation is cut at the first of them (the ``until`` of exported tasks).
        prefix: a task description before the haystack.
        link: a second insert form (variable tracking's chain step, the copy task's closing marker).
        item: the form of one item in a list (queried names, extracted words).
        join: the separator of list items (in questions and answers).
    """

    needle: str = ""
    question: str = ""
    answer_prefix: str = ""
    answer: str = ""
    stop: tuple[str, ...] = ("\n",)
    prefix: str = ""
    link: str = ""
    item: str = "{name}"
    join: str = ", "


@dataclass
class TaskSample:
    """One generated sample.

    Attributes:
        task: the task name.
        ids: the token ids (exactly the requested length), prompt then answer.
        answer_span: ``(start, end)`` of the answer tokens in ``ids`` (``end == len(ids)``).
        answer: the answer text.
        depth: the depth asked for (0–1).
        template: the template index, or None for a custom template.
        fields: what was drawn (keys, names, …), JSON-ready.
        needle_spans: ``(start, end)`` of every insert in ``ids``, in order of position.
        needle_span: ``(start, end)`` of the insert placed at ``depth`` (the task's first insert: the needle
            the question asks for), or ``None`` without inserts.
        filler_tokens: haystack tokens in the sample (``F``).
        haystack_offset: where in the haystack the filler starts.
    """

    task: str
    ids: list[int]
    answer_span: tuple[int, int]
    answer: str
    depth: float
    template: int | None
    fields: dict[str, Any] = field(default_factory=dict)
    needle_spans: list[tuple[int, int]] = field(default_factory=list)
    needle_span: tuple[int, int] | None = None
    filler_tokens: int = 0
    haystack_offset: int = 0

    @property
    def prompt(self) -> list[int]:
        """The ids before the answer."""
        return self.ids[: self.answer_span[0]]

    @property
    def answer_ids(self) -> list[int]:
        """The answer's token ids."""
        return self.ids[self.answer_span[0] : self.answer_span[1]]


@dataclass(frozen=True)
class ChatWrap:
    """A chat template's tokens around a task prompt: ``head + [prompt] + tail + [answer prefix, answer]``.

    The prompt (task description, haystack, question) is the user's message; ``tail`` ends the turn and opens
    the assistant's (the generation prompt), so the answer prefix and the answer are the assistant's first
    words. Built by :func:`ctxext.tasks.chat.chat_wrap`.

    Attributes:
        head: tokens before the user's message (BOS, system turn, user header), as the template renders them.
        tail: tokens after it (end of turn, assistant header).
        source: where the template came from: ``tokenizer`` or the template file's path.
        end: the tokens the template writes after an assistant's message (its end of turn, e.g. ``<|im_end|>``).
        turn: the tokens between an assistant's message and the next user message (end of turn, user header),
            for prompts that ask several questions in turn (:mod:`ctxext.tasks.keyset`); ``None`` where the
            template renders a second user turn differently from the first.
        reason: why this template was used (``auto``'s decision, or that it was asked for).
    """

    head: list[int]
    tail: list[int]
    source: str
    end: list[int] = field(default_factory=list)
    turn: list[int] | None = None
    reason: str = ""


@dataclass
class Prompt:
    """What a task's :meth:`Task.build` draws; :meth:`Task.generate` assembles it (:func:`assemble`).

    Attributes:
        inserts: ``(depth, ids)`` of every insert (needles); equal depths keep this order.
        question: the question text (after the haystack).
        answer: the answer text (the sample's answer is its stripped form) or, for an answer that is a
            piece of the haystack, its token ids (decoded for the answer text).
        fields: what was drawn (keys, names, …), JSON-ready.
        prefix: the text before the haystack; ``None`` is the template's prefix.
        answer_prefix: the text that starts the answer (the template's ``answer_prefix``, filled in).
    """

    inserts: list[tuple[float, list[int]]]
    question: str
    answer: str | list[int]
    fields: dict[str, Any] = field(default_factory=dict)
    prefix: str | None = None
    answer_prefix: str = ""

    def asking(self) -> str:
        """The question and the answer prefix as one text: a plain prompt's end (what a task's budget counts)."""
        return self.question + self.answer_prefix


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def encode_prefix(tokenizer: Any, text: str) -> list[int]:
    """Token ids of the prompt's start, with the tokenizer's defaults (BOS where it adds one)."""
    return list(tokenizer(text, verbose=False)["input_ids"])


def fill(text: str, **fields: Any) -> str:
    """``text.format(**fields)`` with an error naming the unknown field and the ones available."""
    try:
        return text.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise InputError(
            f"template text {text!r} has a field this task does not provide ({exc}); fields: "
            f"{', '.join('{' + k + '}' for k in fields) or 'none'} (double literal braces: {{{{ }}}})"
        ) from None


# Tokens of real text a task's haystack holds at least (samples start at random offsets in it, so trials draw
# their filler from different text): training's task sources and calibration's trials.
HAYSTACK_MIN_TOKENS = 200_000


@dataclass
class Haystack:
    """A token stream that fills the context around the needles (cycled when a sample needs more).

    Attributes:
        ids: the token ids.
        name: what it is (``noise`` or the data source), for reports.
    """

    ids: list[int]
    name: str = "text"

    def __post_init__(self) -> None:
        if not self.ids:
            raise InputError(f"the haystack {self.name!r} is empty: give a data source with text in it")

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, n: int, offset: int) -> list[int]:
        """``n`` tokens starting at ``offset``, wrapping around."""
        size = len(self.ids)
        return [self.ids[(offset + i) % size] for i in range(n)]

    @classmethod
    def from_texts(cls, tokenizer: Any, texts: Iterable[str], min_tokens: int, name: str = "text") -> Haystack:
        """Real text: documents tokenized one by one (each followed by a blank line) until ``min_tokens``.

        Args:
            tokenizer: the tokenizer.
            texts: documents (read lazily).
            min_tokens: stop reading once this many tokens are collected.
            name: the source's name (for reports).
        """
        ids: list[int] = []
        for text in texts:
            ids += encode(tokenizer, text + "\n\n")
            if len(ids) >= min_tokens:
                break
        return cls(ids, name)

    @classmethod
    def noise(cls, tokenizer: Any, min_tokens: int = 4096) -> Haystack:
        """The repetitive noise filler (a whole number of repetitions, so cycling keeps its period)."""
        one = encode(tokenizer, NOISE_TEXT)
        reps = max(1, -(-min_tokens // max(1, len(one))))
        return cls(encode(tokenizer, NOISE_TEXT * reps), "noise")


def draw_names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct 2-letter names (a–j)."""
    pool = [a + b for a in NAME_LETTERS for b in NAME_LETTERS]
    if n > len(pool):
        raise InputError(f"a sample needs {n} distinct names; at most {len(pool)} are available")
    return rng.sample(pool, n)


def draw_keys(rng: random.Random, n: int) -> list[int]:
    """``n`` distinct 5-digit keys."""
    keys: list[int] = []
    while len(keys) < n:
        k = rng.randint(*KEY_RANGE)
        if k not in keys:
            keys.append(k)
    return keys


def draw_words(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct 3-letter lowercase words."""
    letters = string.ascii_lowercase
    words: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(letters) for _ in range(3))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def assemble(
    tokenizer: Any,
    *,
    task: str,
    length: int,
    depth: float,
    rng: random.Random,
    haystack: Haystack,
    prefix: str,
    inserts: Sequence[tuple[float, list[int]]],
    question: list[int],
    answer: list[int],
    answer_text: str,
    template: int | None,
    fields: dict[str, Any],
    chat: ChatWrap | None = None,
    opening: Sequence[int] = (),
) -> TaskSample:
    """The one prompt builder: prefix, haystack with inserts at their depths, question, answer.

    With a chat template (``chat``) the prompt is the user's message: ``chat.head`` replaces the
    tokenizer's default start (the template renders its own BOS), ``chat.tail`` follows the question and
    ``opening`` (the answer prefix) starts the assistant's turn, before the answer.

    Args:
        tokenizer: the tokenizer (for the prefix).
        task: the task's name (for messages and the sample).
        length: total tokens, answer included.
        depth: the depth asked for (recorded in the sample).
        rng: draws the haystack offset.
        haystack: the filler stream.
        prefix: text before the haystack.
        inserts: ``(depth, ids)`` of every insert; equal depths keep this order.
        question: question ids (a plain prompt's: question and answer prefix, tokenized together).
        answer: answer ids.
        answer_text: the answer's text.
        template: the template index.
        fields: what was drawn.
        chat: a chat template's tokens around the prompt (None: a plain prompt).
        opening: with ``chat``, the answer prefix's ids, after the assistant header.

    Returns:
        The :class:`TaskSample`.

    Raises:
        InputError: the length cannot hold the prefix, inserts, question and answer.
    """
    if chat is None:
        head = encode_prefix(tokenizer, prefix)
    else:
        head = chat.head + encode(tokenizer, prefix)
        question = list(question) + chat.tail + list(opening)
    fixed = len(head) + sum(len(ids) for _, ids in inserts) + len(question) + len(answer)
    n_fill = length - fixed
    if n_fill < 0:
        raise InputError(
            f"task {task}: length {length} cannot hold its prompt: prefix, {len(inserts)} needle(s), question and "
            f"answer need {fixed} tokens. Use a length of at least {fixed} tokens (or fewer needles / distractors)."
        )
    if not answer:
        raise InputError(f"task {task}: the answer is empty (check the template's answer text)")
    offset = rng.randrange(len(haystack))
    stream = haystack.take(n_fill, offset)
    placed = sorted(
        ((round(min(max(d, 0.0), 1.0) * n_fill), i, ids) for i, (d, ids) in enumerate(inserts)),
        key=lambda t: (t[0], t[1]),
    )
    ids = list(head)
    spans: list[tuple[int, int]] = []
    first: tuple[int, int] | None = None
    cursor = 0
    for pos, i, piece in placed:
        ids += stream[cursor:pos]
        cursor = pos
        spans.append((len(ids), len(ids) + len(piece)))
        first = spans[-1] if i == 0 else first
        ids += piece
    ids += stream[cursor:]
    ids += question
    start = len(ids)
    ids += answer
    return TaskSample(
        task=task,
        ids=ids,
        answer_span=(start, len(ids)),
        answer=answer_text,
        depth=depth,
        template=template,
        fields=fields,
        needle_spans=spans,
        needle_span=first,
        filler_tokens=n_fill,
        haystack_offset=offset,
    )


class Task:
    """A synthetic long-range task: a generator of samples from a haystack at a length and a depth.

    Subclasses set the class attributes and implement :meth:`build` (which draws a :class:`Prompt`);
    :func:`register_task` makes them available by name.

    Attributes:
        name: the registry name.
        description: one line for listings.
        templates: the surface forms (data: a suite can hold some out of what training uses).
        heldout: template indices reserved for evaluation by default (training uses the others).
        options: option name → default (e.g. ``distractors``), each a non-negative int.
        haystack: ``text`` (real text) or ``noise`` — the haystack the task is meant for by default.
        metric: how a generated answer is string-matched against :meth:`references` — ``all`` (RULER's
            ``string_match_all``: the fraction found) or ``part`` (``string_match_part``: any found).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    templates: ClassVar[tuple[Template, ...]] = ()
    heldout: ClassVar[tuple[int, ...]] = ()
    options: ClassVar[dict[str, int]] = {}
    haystack: ClassVar[str] = "text"
    metric: ClassVar[str] = "all"

    def references(self, sample: TaskSample) -> list[str]:
        """The strings a generated answer must contain (RULER's ``outputs``); default: the answer text.

        Tasks whose answer lists several items (values, words) return the items, so ``all`` scores the
        fraction of them found, in any order and format.
        """
        return [sample.answer]

    def training_templates(self) -> list[int]:
        """The template indices training uses by default (all but the held-out ones)."""
        return [i for i in range(len(self.templates)) if i not in self.heldout]

    def template(self, which: int | Template) -> tuple[Template, int | None]:
        """The template for an index (or a custom :class:`Template`), with its index."""
        if isinstance(which, Template):
            return which, None
        if not 0 <= which < len(self.templates):
            raise InputError(
                f"task {self.name} has templates 0–{len(self.templates) - 1}; template {which} does not exist"
            )
        return self.templates[which], which

    def resolve_options(self, given: dict[str, Any]) -> dict[str, int]:
        """The task's options with defaults filled in; unknown or negative options are errors."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            known = ", ".join(self.options) or "none"
            raise InputError(f"task {self.name}: unknown option(s) {', '.join(unknown)}; its options: {known}")
        out = dict(self.options)
        for k, v in given.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"task {self.name}: option {k} must be a non-negative integer (got {v!r})")
            out[k] = v
        return out

    def generate(
        self,
        tokenizer: Any,
        haystack: Haystack,
        length: int,
        depth: float,
        rng: random.Random,
        *,
        template: int | Template = 0,
        chat: ChatWrap | None = None,
        **options: Any,
    ) -> TaskSample:
        """One sample of exactly ``length`` tokens, its answer last.

        Args:
            tokenizer: the model's tokenizer.
            haystack: the filler (:meth:`Haystack.from_texts` or :meth:`Haystack.noise`).
            length: total tokens, answer included.
            depth: where the (first) needle goes, 0 (start) to 1 (end).
            rng: the only source of randomness (seed it per sample for reproducible sets).
            template: a template index or a custom :class:`Template`.
            chat: a chat template's tokens around the prompt (:func:`ctxext.tasks.chat.chat_wrap`); the
                answer prefix then opens the assistant's turn (without the leading space a plain prompt needs)
                and the answer follows it.
            **options: task options (see :attr:`options`).

        Returns:
            The :class:`TaskSample`.

        Raises:
            InputError: bad depth, template or option, or a length too short for the task.
        """
        if not 0.0 <= float(depth) <= 1.0:
            raise InputError(f"task {self.name}: depth {depth} must be between 0 and 1")
        tpl, index = self.template(template)
        opts = self.resolve_options(options)
        length, depth = int(length), float(depth)
        # A chat template's tokens are part of the length: tasks that fill it (lists, objects) leave them room.
        room = length - (len(chat.head) + len(chat.tail) if chat is not None else 0)
        state = rng.getstate()
        for _ in range(4):
            built = self.build(tokenizer, haystack, room, depth, rng, tpl, index, opts)
            if isinstance(built, TaskSample):
                if chat is not None:
                    raise InputError(
                        f"task {self.name} builds its samples itself and cannot be wrapped in a chat template: "
                        "evaluate it with chat_template none (--chat-template none), or make its build return a "
                        "Prompt"
                    )
                return built
            prompt = built
            prefix = fill(tpl.prefix) if prompt.prefix is None else prompt.prefix
            question, opening, answer = _encode_ask(tokenizer, prompt, chat)
            if chat is None:
                break
            # A task counts its question and answer prefix as one text (a plain prompt's); in a chat they are
            # tokenized apart, which can take a token or two more: the same draw again, with that much less room.
            used = len(chat.head) + len(encode(tokenizer, prefix)) + sum(len(ids) for _, ids in prompt.inserts)
            over = used + len(question) + len(chat.tail) + len(opening) + len(answer) - length
            if over <= 0:
                break
            rng.setstate(state)
            room -= over
        return assemble(
            tokenizer,
            task=self.name,
            length=length,
            depth=depth,
            rng=rng,
            haystack=haystack,
            prefix=prefix,
            inserts=prompt.inserts,
            question=question,
            answer=answer,
            answer_text=prompt.answer.strip() if isinstance(prompt.answer, str) else tokenizer.decode(answer),
            template=index,
            fields=prompt.fields,
            chat=chat,
            opening=opening,
        )

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt | TaskSample:
        """Draw a sample (subclasses); the arguments are :meth:`generate`'s, already validated.

        Args:
            tokenizer: the model's tokenizer.
            haystack: the filler.
            length: total tokens, answer included.
            depth: where the (first) needle goes, 0–1.
            rng: the only source of randomness.
            tpl: the :class:`Template`.
            index: the template's index (``None`` for a custom template).
            opts: the task's options, defaults filled in.

        Returns:
            A :class:`Prompt`, which :meth:`generate` assembles around the haystack, or a complete
            :class:`TaskSample` (from :func:`assemble`, for a task that builds its sample itself).
        """
        raise NotImplementedError


def _encode_ask(tokenizer: Any, built: Prompt, chat: ChatWrap | None) -> tuple[list[int], list[int], list[int]]:
    """The ids of the question, the assistant's opening (the answer prefix) and the answer.

    A plain prompt tokenizes question + answer prefix as one text (the opening is empty), so its tokens are
    those of a prompt that was written as one question. In a chat the answer prefix opens the assistant's turn
    without its leading whitespace, and an answer with no prefix before it loses its own.
    """
    text = built.answer
    if chat is None:
        opening: list[int] = []
        question = encode(tokenizer, built.asking())
    else:
        lead = built.answer_prefix.lstrip()
        question, opening = encode(tokenizer, built.question), encode(tokenizer, lead)
        if isinstance(text, str) and not lead:
            text = text.lstrip()  # the assistant's turn starts with the answer: no word before it to space from
    answer = encode(tokenizer, text) if isinstance(text, str) else list(text)
    return question, opening, answer
