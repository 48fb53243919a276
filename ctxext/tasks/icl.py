"""``icl``: many-shot in-context classification over made-up labels (HELMET's ICL family).

The sample is a long list of labelled examples ``text → label`` followed by one query text; the answer is
the query's label. Labels (option ``labels``, default 6) and keywords are random 3-letter words drawn per
sample, and each keyword is mapped to one label at random, so the mapping can only be learnt from the
examples in context, never from pretraining. An example's text is its keyword among two filler words
(shuffled); the filler words carry no label information. The query's keyword appears in exactly one
example, the one at the depth asked for *within the list* (0: the first example, 1: the last); every
other example uses one of the other keywords, each of which recurs with its label. The query's filler
words are drawn afresh, so matching the keyword (not copying a line) gives the label.

As many examples as fit fill the sample (a few haystack tokens make up the rest, before the list).
Scored like RULER's QA tasks (``string_match_part``) on the label.

Template fields: ``needle`` opens the list, ``item`` is one example (``{input}``, ``{label}``), ``join``
separates examples, ``link`` closes the list; question and answer prefix ``{input}``; answer ``{label}``.
"""

from __future__ import annotations

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_words, encode, encode_prefix, fill
from ctxext.tasks.registry import register_task

ICL_TEMPLATES = (
    Template(needle="\n", item="{input} -> {label}", join="\n", answer_prefix="\n{input} ->", answer=" {label}"),
    Template(
        needle="\n\n",
        item="Input: {input}\nLabel: {label}",
        join="\n\n",
        question="\n\nInput: {input}",
        answer_prefix="\nLabel:",
        answer=" {label}",
    ),
    Template(
        needle="\nexamples = [\n    ",
        item='("{input}", "{label}")',
        join=",\n    ",
        link=",\n]\n",
        answer_prefix='\nassert classify("{input}") ==',
        answer=' "{label}"',
    ),
    Template(
        # HELMET's ICL prompt.
        prefix="Use the provided mapping from the text to label to assign a label to the text.",
        needle="\n\n",
        item="{input}\nlabel: {label}",
        join="\n\n",
        question="\n\n{input}",
        answer_prefix="\nlabel:",
        answer=" {label}",
    ),
    Template(needle="\n", item="# {input} => {label}", join="\n", answer_prefix="\n# {input} =>", answer=" {label}"),
)

# Keywords per label: enough that each label recurs under several surface words.
KEYWORDS_PER_LABEL = 3
# Filler words: the noise around each example's keyword.
FILLER_WORDS = 24


@register_task
class ICL(Task):
    """The label of a query whose keyword's label is shown by one of many in-context examples."""

    name = "icl"
    description = "many-shot in-context classification over made-up labels; asks a query's label (HELMET ICL)"
    templates = ICL_TEMPLATES
    heldout = (4,)
    options = {"labels": 6}
    metric = "part"

    def references(self, sample: TaskSample) -> list[str]:
        """The query's label (without the quotes a template may put around it)."""
        return [sample.fields["label"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        n_labels = opts["labels"]
        if n_labels < 2:
            raise InputError("task icl: option labels must be at least 2 (a classification needs two labels)")
        n_kw = KEYWORDS_PER_LABEL * n_labels
        words = draw_words(rng, n_labels + n_kw + FILLER_WORDS)
        labels, keywords, fillers = words[:n_labels], words[n_labels : n_labels + n_kw], words[n_labels + n_kw :]
        # Every label gets KEYWORDS_PER_LABEL keywords, in a random order: the mapping exists only in context.
        slots = [lab for lab in labels for _ in range(KEYWORDS_PER_LABEL)]
        label_of = dict(zip(keywords, rng.sample(slots, n_kw), strict=True))
        asked_kw, others = keywords[0], keywords[1:]

        def text(keyword: str) -> tuple[str, str]:
            parts = [keyword, *rng.sample(fillers, 2)]
            rng.shuffle(parts)
            return keyword, " ".join(parts)

        query = text(asked_kw)[1]
        question, answer = fill(tpl.question, input=query), fill(tpl.answer, label=label_of[asked_kw])
        answer_prefix = fill(tpl.answer_prefix, input=query)
        prefix = len(encode_prefix(tokenizer, fill(tpl.prefix)))
        budget = length - prefix - len(encode(tokenizer, question + answer_prefix)) - len(encode(tokenizer, answer))
        shell = encode(tokenizer, fill(tpl.needle) + fill(tpl.link))
        per_item = max(1, len(encode(tokenizer, tpl.join + fill(tpl.item, input=query, label=labels[0]))))
        # Twice the estimate as an upper bound, then a binary search for the most examples that fit:
        # texts tokenize to varying lengths, so only encoding the whole list tells.
        texts = [text(rng.choice(others)) for _ in range(2 * max(1, (budget - len(shell)) // per_item) + 2)]
        asked_text = text(asked_kw)  # the example the query shares its keyword with (not its filler words)
        while asked_text[1] == query:
            asked_text = text(asked_kw)

        def examples(n: int) -> list[int]:
            target = round(depth * (n - 1))
            shown = texts[:target] + [asked_text] + texts[target + 1 : n]
            items = tpl.join.join(fill(tpl.item, input=t, label=label_of[kw]) for kw, t in shown)
            return encode(tokenizer, fill(tpl.needle) + items + fill(tpl.link))

        one = len(examples(1))
        if one > budget:
            raise InputError(
                f"task icl: length {length} cannot hold one example plus the question and answer "
                f"({length - budget + one} tokens). Use a longer length."
            )
        lo, hi = 1, len(texts)  # examples(lo) fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if len(examples(mid)) <= budget else (lo, mid - 1)
        n, ids, target = lo, examples(lo), round(depth * (lo - 1))
        return Prompt(
            # The examples end right before the question; the few spare tokens are haystack before them.
            inserts=[(1.0, ids)],
            question=question,
            answer=answer,
            fields={
                "label": label_of[asked_kw],
                "keyword": asked_kw,
                "query": query,
                "labels": labels,
                "examples": n,
                "position": target,
            },
            answer_prefix=answer_prefix,
        )
