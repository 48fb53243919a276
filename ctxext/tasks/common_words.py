"""``common_words``: a list of words where a few recur more often; asks for the most common ones (RULER's CWE).

The list is the needle (placed at the depth asked for; the rest of the length is haystack). The ``top``
common words appear ``s·(top+1), s·top, …, 2s`` times — distinct counts, so the answer's order (most
common first) is defined — and every other word once; ``s`` is chosen so the common words fill about
half of the list. Template fields: needle (opens the list); ``item`` ``{word}``; question and answer prefix
``{top}`` (a code form's question closes the list);
answer ``{words}`` (the common words as items, joined by ``join``). Option ``top`` (default 3).
"""

from __future__ import annotations

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_words, encode, encode_prefix, fill
from ctxext.tasks.registry import register_task

COMMON_WORDS_TEMPLATES = (
    Template(
        needle="\nwords = [",
        item="'{word}'",
        question="]",
        answer_prefix="\nassert most_common(words, {top}) == [",
        answer="{words}",
        stop=("]", "\n"),
    ),
    Template(
        needle="\nnames = (",
        item='"{word}"',
        question=")",
        answer_prefix="\nassert top(names, {top}) == [",
        answer="{words}",
        stop=("]", "\n"),
    ),
    Template(
        needle="\n# words: ",
        item="{word}",
        join=" ",
        answer_prefix="\n# the {top} most common words above:",
        answer=" {words}",
        stop=(".", "\n"),
    ),
    Template(
        needle=" Below is a list of words. Some of them appear more often than others. Memorize the ones that "
        "appear most often.\n",
        item="{word}",
        join=" ",
        question="\nQuestion: What are the {top} most common words in the above list?",
        answer_prefix=" Answer: The top {top} words appearing most often in the list are:",
        answer=" {words}",
        stop=(".", "\n"),
    ),
    Template(
        needle="\nitems = [",
        item="'{word}'",
        question="]",
        answer_prefix="\nassert Counter(items).most_common({top}) == [",
        answer="{words}",
        stop=("]", "\n"),
    ),
)


@register_task
class CommonWords(Task):
    """Frequency aggregation over a long list."""

    name = "common_words"
    description = "a word list with a few frequent words; asks for the most common ones"
    templates = COMMON_WORDS_TEMPLATES
    heldout = (4,)
    options = {"top": 3}

    def references(self, sample: TaskSample) -> list[str]:
        """The common words: a generated answer scores the fraction of them it names (RULER's CWE)."""
        return list(sample.fields["common"])

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        top = max(1, opts["top"])
        vocab = draw_words(rng, top + 4 * length)
        common, rare_pool = vocab[:top], vocab[top:]
        answer = fill(tpl.answer, words=tpl.join.join(fill(tpl.item, word=w) for w in common))
        question, answer_prefix = fill(tpl.question, top=top), fill(tpl.answer_prefix, top=top)
        fixed = (
            len(encode_prefix(tokenizer, fill(tpl.prefix)))
            + len(encode(tokenizer, question + answer_prefix))
            + len(encode(tokenizer, answer))
        )
        budget = length - fixed
        opening = fill(tpl.needle)

        def listing(items: list[str]) -> list[int]:
            return encode(tokenizer, opening + tpl.join.join(fill(tpl.item, word=w) for w in items))

        per_item = max(1.0, len(listing(rare_pool[:20])) / 20)
        weights = [top + 1 - i for i in range(top)]  # top+1, top, …, 2
        n_items = int((budget - len(listing([]))) // per_item)
        scale = max(1, n_items // (2 * sum(weights)))
        counts = [scale * w for w in weights]
        n_rare = max(0, n_items - sum(counts))
        while True:
            items = [w for w, c in zip(common, counts, strict=True) for _ in range(c)] + rare_pool[:n_rare]
            rng.shuffle(items)
            ids = listing(items)
            over = len(ids) - budget
            if over <= 0:
                break
            if n_rare > 0:
                n_rare = max(0, n_rare - max(1, int(over / per_item)))
            elif scale > 1:
                scale -= 1
                counts = [scale * w for w in weights]
            else:
                raise InputError(
                    f"task common_words: length {length} cannot hold a list in which the {top} most common words "
                    f"are distinct ({sum(weights)} items at least, plus the question and answer: {fixed} tokens). "
                    "Use a longer length or a smaller option top."
                )
        drawn = {"common": common, "counts": counts, "rare": n_rare}
        return Prompt([(depth, ids)], question, answer, drawn, None, answer_prefix)
