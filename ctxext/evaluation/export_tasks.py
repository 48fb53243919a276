"""Export ctxext's registered tasks as lm-evaluation-harness task files: ``ctxext tasks export DIR --format lm-eval``.

Each task × length becomes one lm-eval task, ``ctxext_<task>_<length>`` (tagged ``ctxext_<task>``): a YAML file
over a local JSONL file (``dataset_path: json``), so ``lm_eval --include_path DIR --tasks ctxext_needle`` runs
offline. Its documents are the prompts of ctxext's own retrieval grid for the model's tokenizer — the same
seeded samples (:func:`ctxext.tasks.samples.make_samples`, the settings of the RULER-style suite:
:class:`~ctxext.evaluation.sections.ruler.engine.RulerSettings`) — written as text: the grid's prompt tokens
decoded with their special tokens (a leading BOS string makes lm-eval add no second one). lm-eval tokenizes
that text again; a byte-level BPE can merge across a piece boundary (haystack / needle / question), so each
document records ``tokens_match``, whether the text comes back as the grid's exact tokens (:func:`harness_prompt_ids`).

Scoring is free generation, greedy, ``max_gen_toks`` = the longest answer in tokens, stopped at a newline
(unless an answer holds one), ``exact_match`` after stripping (:mod:`ctxext.scoring.exact_match`).

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
from ctxext.evaluation.sections.grids.engine import GridSettings, text_haystack
from ctxext.evaluation.sections.ruler.engine import RulerSettings, template_indices
from ctxext.scoring.exact_match import STRIP_PATTERNS
from ctxext.tasks import TaskSample
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
        max_gen_toks: the answer budget (the longest answer, in tokens).
        until: the stop sequences.
    """

    name: str
    task: str
    label: str
    length: int
    documents: int
    tokens_match: int
    max_gen_toks: int
    until: list[str]


@dataclass
class ExportResult:
    """What :func:`export_lm_eval` wrote.

    Attributes:
        out: the folder (``--include_path`` for lm-eval).
        model: the model whose tokenizer built the prompts.
        context_length: the model's context (``max_position_embeddings``).
        tasks: the exported tasks.
        tags: one tag per registered task (all its lengths).
    """

    out: Path
    model: str
    context_length: int
    tasks: list[ExportedTask] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)

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


def task_config(name: str, tag: str, data_file: Path, max_gen_toks: int, until: list[str]) -> dict[str, Any]:
    """The lm-eval task YAML of one exported task (greedy generation, exact match after stripping)."""
    return {
        "task": name,
        "tag": [tag],
        "dataset_path": "json",
        # Absolute: lm-eval hands data_files to datasets, which resolves them against the working folder.
        "dataset_kwargs": {"data_files": {"test": str(data_file)}},
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
        settings: tasks, lengths, depths, trials, seed, haystack and templates (those of the RULER-style suite,
            so the documents are that suite's samples).
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
    out = check_output(out, EXPORT_KIND, overwrite)
    tokenizer, config = load_tokenizer_and_config(model)
    context = int(read_rope(config).current_length)
    lengths = sorted(set(settings.lengths))
    _check_lengths(lengths, context, settings.allow_beyond_context, model)
    hay = text_haystack(tokenizer, settings.haystack, settings.text_field, settings.split, 2 * max(lengths))
    grid = GridSettings(lengths=lengths, depths=list(settings.depths), trials=settings.trials, seed=settings.seed)
    grid.validate()
    final = out.resolve()
    result = ExportResult(out=out, model=model, context_length=context)
    with atomic_folder(out, kind=EXPORT_KIND, overwrite=overwrite) as tmp:
        for spec in settings.tasks:
            templates = template_indices(spec.task, spec.templates or settings.templates)
            tag = f"{TASK_PREFIX}{spec.label}"
            result.tags.append(tag)
            for length in lengths:
                docs = [
                    _document(tokenizer, s, length, float(depth), trial)
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
                        )
                    )
                ]
                name = f"{tag}_{length}"
                budget = max(d["answer_tokens"] for d in docs)
                until = [] if any("\n" in d["answer"] for d in docs) else ["\n"]
                (tmp / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
                config_yaml = task_config(name, tag, final / f"{name}.jsonl", budget, until)
                _write_yaml(tmp / f"{name}.yaml", config_yaml)
                matched = sum(d["tokens_match"] for d in docs)
                exported = ExportedTask(name, spec.task, spec.label, length, len(docs), matched, budget, until)
                result.tasks.append(exported)
        manifest = {
            "format": "lm-eval",
            "model": model,
            "context_length": context,
            "max_length": result.max_length,
            "command": command,
            "settings": settings.model_dump(),
            "haystack": hay.name,
            "tags": result.tags,
            "tasks": [asdict(t) for t in result.tasks],
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return result


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


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
