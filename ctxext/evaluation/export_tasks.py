"""Export ctxext's registered tasks as lm-evaluation-harness task files: ``ctxext tasks export DIR --format lm-eval``.

Each task × length becomes one lm-eval task, ``ctxext_<task>_<length>`` (tagged ``ctxext_<task>``): a YAML file
over a local JSONL file beside it (read through the folder's own loader module, :data:`LOADER_MODULE`, so the
folder can be moved), so ``lm_eval --include_path DIR --tasks ctxext_needle`` runs offline. Its documents are
the prompts of ctxext's own retrieval grid for the model's tokenizer — the same seeded samples
(:func:`ctxext.tasks.samples.make_samples`, the settings of the RULER-style suite:
:class:`~ctxext.evaluation.sections.ruler.engine.RulerSettings`) — written as text: the grid's prompt tokens
decoded with their special tokens (a leading BOS string makes lm-eval add no second one). lm-eval tokenizes
that text again; a byte-level BPE can merge across a piece boundary (haystack / needle / question), so each
document records ``tokens_match``, whether the text comes back as the grid's exact tokens (:func:`harness_prompt_ids`).

Chat templates are applied as the grid applies them (``chat_template``, :mod:`ctxext.tasks.chat`: ``auto`` decided
from the exported model): the prompt text already holds the template (user turn, assistant header) and ends with
the answer prefix, so lm-eval runs it as it is (without ``--apply_chat_template``).

Scoring is free generation, greedy, ``exact_match`` after stripping (:mod:`ctxext.scoring.exact_match`). Every
document gets the same room and the same stop rule, so how strictly it is scored does not depend on how long its
answer is: ``max_gen_toks`` = the longest answer in tokens plus the grid's ``answer_margin`` (at least
``max_new_tokens``), and generation stops at the task templates' terminators (:attr:`ctxext.tasks.Template.stop`:
what follows an answer in its form, a ``.`` after a pass key, a newline after a code line), the chat template's
end of turn, and lm-eval's EOS. A stop that occurs inside an answer of the task is left out (a file path's ``.``).

Why this lives in ``evaluation/`` (not ``tasks/``): it reuses the grid's seeding, haystack and template choice,
which are evaluation's; ``tasks/`` stays a core package that knows nothing of grids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxext.atomic import atomic_folder, check_output
from ctxext.errors import InputError
from ctxext.evaluation.sections.grids.engine import text_haystack
from ctxext.evaluation.sections.ruler.engine import RulerSettings, template_indices
from ctxext.scoring.exact_match import STRIP_PATTERNS
from ctxext.tasks import Task, TaskSample, get_task
from ctxext.tasks.base import ChatWrap
from ctxext.tasks.chat import chat_format, describe_chat
from ctxext.tasks.samples import make_samples

EXPORT_KIND = "lm-eval-tasks"
MANIFEST = "ctxext-tasks.json"
FORMATS = ("lm-eval",)
TASK_PREFIX = "ctxext_"


@dataclass
class ExportedTask:
    """One exported lm-eval task (a registered task at one length).

    Attributes:
        name: the lm-eval task name (``ctxext_<label>_<length>``).
        task: the registered task.
        label: its label (the tag is ``ctxext_<label>``).
        length: sample length in tokens (prompt + answer).
        documents: how many documents (depths × trials).
        tokens_match: documents whose text tokenizes back to the grid's exact prompt tokens.
        max_gen_toks: the answer budget (the longest answer in tokens plus the margin).
        until: the stop sequences (the templates' terminators, the chat template's end of turn).
        margin: tokens every document may generate beyond its answer, at least.
    """

    name: str
    task: str
    label: str
    length: int
    documents: int
    tokens_match: int
    max_gen_toks: int
    until: list[str]
    margin: int = 0


@dataclass
class ExportResult:
    """What :func:`export_lm_eval` wrote.

    Attributes:
        out: the folder (``--include_path`` for lm-eval).
        model: the model whose tokenizer built the prompts.
        context_length: the model's context (``max_position_embeddings``).
        tasks: the exported tasks.
        tags: one tag per registered task (all its lengths).
        chat_template: the chat template the prompts are in (``none``, ``tokenizer`` or a file).
        chat_template_reason: why (``auto``'s decision, or asked for).
    """

    out: Path
    model: str
    context_length: int
    tasks: list[ExportedTask] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    chat_template: str = "none"
    chat_template_reason: str = ""

    @property
    def max_length(self) -> int:
        """The ``max_length`` lm-eval needs for the longest task: its length plus its answer budget."""
        return max(t.length + t.max_gen_toks for t in self.tasks)


def harness_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The tokens lm-eval's ``HFLM`` feeds the model for a prompt text (0.4.13, ``add_bos_token`` unset).

    A text starting with the BOS string is encoded without special tokens (the BOS string becomes the BOS
    token); any other with the tokenizer's defaults.
    """
    bos = getattr(tokenizer, "bos_token", None)
    special = {"add_special_tokens": False} if bos and text.startswith(bos) else {}
    return list(tokenizer(text, verbose=False, **special)["input_ids"])


def _document(tokenizer: Any, sample: TaskSample, length: int, depth: float, trial: int) -> dict[str, Any]:
    text = tokenizer.decode(sample.prompt, skip_special_tokens=False)
    return {
        "prompt": text,
        "answer": sample.answer,
        "task": sample.task,
        "length": length,
        "depth": depth,
        "trial": trial,
        "template": sample.template,
        "prompt_tokens": len(sample.prompt),
        "answer_tokens": len(sample.answer_ids),
        "tokens_match": harness_prompt_ids(tokenizer, text) == sample.prompt,
        # JSON text: the drawn fields differ in type between tasks, and the json loader wants one schema.
        "fields": json.dumps(sample.fields, sort_keys=True),
    }


# The data loader written beside the task files. lm-eval hands ``dataset_kwargs: data_files`` to datasets, which
# resolves a relative path against the working folder (an absolute one would make a copied or moved export score
# the original's data); a ``custom_dataset: !function`` is imported from the YAML's own folder, so this module
# finds the documents beside itself wherever the folder goes. It needs only ``datasets`` (lm-eval's dependency).
LOADER_MODULE = "ctxext_data"
LOADER_SOURCE = '''"""Loads a task's documents from the JSONL file beside this module (`ctxext tasks export`).

lm-eval imports it through `custom_dataset: !function ctxext_data.load` in each task YAML of this folder, so
the folder can be copied or moved as a whole.
"""

from pathlib import Path


def load(data_file, **_):
    import datasets

    path = Path(__file__).resolve().parent / data_file
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the task's documents are missing; export the tasks again with `ctxext tasks export`"
        )
    return datasets.load_dataset("json", data_files={"test": str(path)})
'''
_FUNCTION_TAG = "!function"


def task_config(name: str, tag: str, data_file: str, max_gen_toks: int, until: list[str]) -> dict[str, Any]:
    """The lm-eval task YAML of one exported task (greedy generation, exact match after stripping).

    Its ``custom_dataset`` (a ``!function`` tag, which plain YAML cannot hold) is added by :func:`_write_yaml`;
    ``data_file`` is the JSONL's name, relative to the task's folder.
    """
    return {
        "task": name,
        "tag": [tag],
        "dataset_path": "json",
        "dataset_kwargs": {"data_file": data_file},
        "test_split": "test",
        "output_type": "generate_until",
        # Field names, not Jinja templates: lm-eval passes a document's field through untouched.
        "doc_to_text": "prompt",
        "doc_to_target": "answer",
        "generation_kwargs": {"until": until, "max_gen_toks": max_gen_toks, "do_sample": False, "temperature": 0.0},
        "num_fewshot": 0,
        "metric_list": [
            {
                "metric": "exact_match",
                "aggregation": "mean",
                "higher_is_better": True,
                "regexes_to_ignore": list(STRIP_PATTERNS),
            }
        ],
        "metadata": {"version": 1.0, "generator": "ctxext tasks export"},
    }


def _check_lengths(lengths: list[int], context: int, allow_beyond: bool, model: str) -> None:
    beyond = [L for L in lengths if L > context]
    if beyond and not allow_beyond:
        raise InputError(
            f"--lengths {beyond}: beyond the context of {model} ({context} tokens); export lengths up to {context}, "
            "or pass --allow-beyond-context to export them anyway"
        )


def export_lm_eval(
    model: str, out: str | Path, settings: RulerSettings, overwrite: bool = False, command: str | None = None
) -> ExportResult:
    """Write registered tasks as lm-eval task files over local JSONL, prompts built for ``model``'s tokenizer.

    Args:
        model: model folder, ``builtin:NAME``, Hub id or ctxext run folder (its tokenizer and config are read;
            its weights are not).
        out: the folder to write (``--include_path`` for lm-eval); refused if it exists, unless ``overwrite``
            and it is an earlier export.
        settings: tasks, lengths, depths, trials, seed, haystack, templates, chat template and generation margin
            (those of the RULER-style suite, so the documents are that suite's samples).
        overwrite: replace an earlier export at ``out``.
        command: the command line, recorded in the manifest.

    Returns:
        The :class:`ExportResult`.

    Raises:
        InputError: an unknown task or template, a length beyond the model's context (unless allowed) or too
            short for a task, or an output folder that cannot be written.
    """
    from ctxext.models.load import load_tokenizer_and_config
    from ctxext.rope.read import read_rope

    settings.check()
    if not settings.lengths or min(settings.lengths) < 1:
        raise InputError("--lengths: give at least one positive length in tokens, e.g. --lengths 256,1024")
    out = check_output(out, EXPORT_KIND, overwrite, flag="OUT")
    tokenizer, config = load_tokenizer_and_config(model)
    context = int(read_rope(config).current_length)
    lengths = sorted(set(settings.lengths))
    _check_lengths(lengths, context, settings.allow_beyond_context, model)
    chat, reason = _chat(tokenizer, model, settings.chat_template)
    hay = text_haystack(tokenizer, settings.haystack, settings.text_field, settings.split, 2 * max(lengths))
    grid = settings.grid(lengths, settings.allow_beyond_context)
    grid.validate()
    result = ExportResult(out, model, context, chat_template=describe_chat(chat), chat_template_reason=reason)
    with atomic_folder(out, kind=EXPORT_KIND, overwrite=overwrite, flag="OUT") as tmp:
        for spec in settings.tasks:
            templates = template_indices(spec.task, spec.templates or settings.templates)
            tag = f"{TASK_PREFIX}{spec.label}"
            result.tags.append(tag)
            for length in lengths:
                samples = [
                    (float(depth), trial, s)
                    for depth in grid.depths
                    for trial, s in enumerate(
                        make_samples(
                            tokenizer,
                            spec.task,
                            hay,
                            length,
                            float(depth),
                            trials=grid.trials,
                            seed=grid.seed,
                            template=templates,
                            options=spec.options,
                            chat=chat,
                        )
                    )
                ]
                docs = [_document(tokenizer, s, length, depth, trial) for depth, trial, s in samples]
                name = f"{tag}_{length}"
                # One budget for every document, at least answer_margin tokens beyond each one's answer.
                margin = grid.answer_margin
                budget = max(grid.max_new_tokens, max(d["answer_tokens"] for d in docs) + margin)
                until = stop_sequences(get_task(spec.task), templates, [d["answer"] for d in docs], tokenizer, chat)
                (tmp / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
                _write_yaml(tmp / f"{name}.yaml", task_config(name, tag, f"{name}.jsonl", budget, until))
                matched = sum(d["tokens_match"] for d in docs)
                result.tasks.append(
                    ExportedTask(name, spec.task, spec.label, length, len(docs), matched, budget, until, margin)
                )
        manifest = {
            "format": "lm-eval",
            "model": model,
            "context_length": context,
            "max_length": result.max_length,
            "command": command,
            "settings": settings.model_dump(),
            "haystack": hay.name,
            "chat_template": result.chat_template,
            "chat_template_reason": result.chat_template_reason,
            "tags": result.tags,
            "tasks": [asdict(t) for t in result.tasks],
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        (tmp / f"{LOADER_MODULE}.py").write_text(LOADER_SOURCE)
    return result


def _chat(tokenizer: Any, model: str, choice: str) -> tuple[ChatWrap | None, str]:
    """The chat template of the export's prompts and why (``auto``: decided from the model, as a comparison's)."""
    from ctxext.evaluation.settings import decide_chat

    decided = decide_chat(model, "") if choice == "auto" else None
    return chat_format(tokenizer, choice, "--chat-template", decided=decided)


def stop_sequences(
    task: Task, templates: list[int], answers: list[str], tokenizer: Any, chat: ChatWrap | None
) -> list[str]:
    """Where generation stops for one exported task: its templates' terminators and the chat template's end of turn.

    A stop that occurs in one of the task's answers is left out: it would cut that answer short.

    Args:
        task: the registered task.
        templates: the template indices its documents use.
        answers: every document's answer.
        tokenizer: the tokenizer (to write the chat template's end of turn as text).
        chat: the chat template's tokens, or None.
    """
    stops: list[str] = []
    for index in templates:
        stops += [s for s in task.templates[index].stop if s not in stops]
    if chat is not None and chat.end:
        end = tokenizer.decode(chat.end[-1:], skip_special_tokens=False).strip()
        stops += [end] if end and end not in stops else []
    return [s for s in stops if not any(s in answer for answer in answers)]


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    import yaml

    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    path.write_text(f"{text}custom_dataset: {_FUNCTION_TAG} {LOADER_MODULE}.load\n")


def read_task_config(path: str | Path) -> dict[str, Any]:
    """An exported task YAML as a dict (its ``!function`` reference as the text ``!function NAME``).

    Raises:
        OSError, yaml.YAMLError: the file cannot be read or parsed.
    """
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        return f"{_FUNCTION_TAG} {loader.construct_scalar(node)}"  # type: ignore[arg-type]

    _Loader.add_constructor(_FUNCTION_TAG, function)
    return yaml.load(Path(path).read_text(), Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def missing_data(folder: str | Path) -> list[Path]:
    """The files an export's tasks read that are not in ``folder`` (its loader module, each task's documents).

    A folder ``ctxext tasks export`` did not write (a user's own lm-eval tasks) has none: ``[]``.
    """
    folder = Path(folder)
    export = read_export(folder)
    if export is None:
        return []
    names = [f"{LOADER_MODULE}.py", *(f"{t.get('name')}.jsonl" for t in export.get("tasks", []))]
    return [folder / n for n in names if not (folder / n).is_file()]


def read_export(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of a folder written by :func:`export_lm_eval`, or ``None`` for any other folder."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
