"""``doc_qa``: many code documents, each under its file name; asks which file defines a name (RAG-style QA).

The haystack is cut into ``docs`` documents (option, default 6): document ``k`` starts at depth ``k/docs``
with a header naming its file (template ``needle``, ``{path}``), and its text is the haystack that
follows (held-out code in an evaluation: ``builtin:stdlib``). Each document defines one name (template
``link``, ``{func}``) at a random place in it; the asked name is defined in the document that holds the
depth asked for, exactly at that depth — every other document is a distractor defining another name.
Paths and names are random 3-letter words (``abc/def_ghi.py``, ``jkl_mno``), so no model knows them from
pretraining. Scored like RULER's QA tasks (``string_match_part``) on the file path.

Template fields: needle ``{path}``; link ``{func}``; question and answer prefix ``{func}``; answer ``{path}``
(paths hold a ``.``, so only a newline ends an answer).
"""

from __future__ import annotations

from ctxext.errors import InputError
from ctxext.tasks.base import Prompt, Task, TaskSample, Template, draw_words, encode, fill
from ctxext.tasks.registry import register_task

DOC_QA_TEMPLATES = (
    Template(
        needle="\n\n# file: {path}\n",
        link="\ndef {func}(*args):\n    return None\n",
        question="\n\n# Q: which file defines {func}?",
        answer_prefix=" A: the file",
        answer=" {path}",
    ),
    Template(
        needle='\n\n"""{path}"""\n',
        link="\nclass {func}:\n    pass\n",
        answer_prefix="\n\n# {func} is defined in",
        answer=" {path}",
    ),
    Template(
        needle="\n\n### {path}\n",
        link="\n{func} = object()\n",
        answer_prefix="\n\n# {func} is assigned in the file",
        answer=" {path}",
    ),
    Template(
        prefix="Answer the question based on the given documents.",
        needle="\n\nDocument (file {path}):\n",
        link="\ndef {func}():\n",
        question="\n\nQuestion: Which file defines the function {func}?",
        answer_prefix=" Answer: The function {func} is defined in the file",
        answer=" {path}",
    ),
    Template(
        needle="\n\n# --- {path} ---\n",
        link="\nasync def {func}():\n    pass\n",
        question="\n\n# where is {func} defined?",
        answer_prefix=" in",
        answer=" {path}",
    ),
)


@register_task
class DocQA(Task):
    """Which of many files defines a name."""

    name = "doc_qa"
    description = "many code documents under file names; asks which file defines a name (distractor documents)"
    templates = DOC_QA_TEMPLATES
    heldout = (4,)
    options = {"docs": 6}
    metric = "part"

    def references(self, sample: TaskSample) -> list[str]:
        """The file path."""
        return [sample.fields["path"]]

    def build(self, tokenizer, haystack, length, depth, rng, tpl, index, opts) -> Prompt:  # noqa: D102
        n = opts["docs"]
        if n < 1:
            raise InputError("task doc_qa: option docs must be at least 1")
        words = draw_words(rng, 5 * n)
        paths = [f"{words[i]}/{words[n + i]}_{words[2 * n + i]}.py" for i in range(n)]
        funcs = [f"{words[3 * n + i]}_{words[4 * n + i]}" for i in range(n)]
        target = min(n - 1, int(depth * n))
        inserts: list[tuple[float, list[int]]] = []
        for k in range(n):
            start, end = k / n, (k + 1) / n
            at = depth if k == target else rng.uniform(start, end)
            inserts.append((start, encode(tokenizer, fill(tpl.needle, path=paths[k]))))
            # Strictly after the header (equal depths keep insert order), before the next document's.
            inserts.append((min(max(at, start), end), encode(tokenizer, fill(tpl.link, func=funcs[k]))))
        return Prompt(
            inserts=inserts,
            question=fill(tpl.question, func=funcs[target]),
            answer=fill(tpl.answer, path=paths[target]),
            fields={"path": paths[target], "func": funcs[target], "document": target, "docs": n},
            answer_prefix=fill(tpl.answer_prefix, func=funcs[target]),
        )
