"""The model card (``README.md``) of a published extension: Hub metadata plus what a user needs to trust and use it.

The YAML front matter is built with huggingface_hub's :class:`~huggingface_hub.ModelCardData` and
:class:`~huggingface_hub.EvalResult`, so ``model-index`` has exactly the structure the Hub reads
(perplexity per length and passkey accuracy show up as evaluation results on the model page).

The prose says what was changed (method, factor, every rope parameter), how it was trained, how it
scored (tables and plots from ``ctxext eval`` reports), what it cost at the original context, and how
to load and serve it with the right RoPE — the step users most often get wrong (:mod:`ctxext.publish.card_usage`).
Reports are read through the report schema (:mod:`ctxext.artifacts.report`); what each suite section shows in a
card (its rows, its ``model-index`` results, its short-context cost) was rendered by the section when the report
was written and stored in it (``card``), so the card needs no section's code. A report written before the card
parts were stored adds its plots and no rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ctxext.artifacts.run import Report, RunRecord
from ctxext.artifacts.tables import fmt
from ctxext.models.refs import is_hub_id
from ctxext.publish.card_usage import load_section, rope_parameters, serving_section


@dataclass
class CardInputs:
    """Everything the card is built from.

    Attributes:
        run: the run's record.
        config: the patched ``config.json`` content.
        recipe: the run's resolved recipe (``recipe.yaml``), if present.
        versions: ``versions.json``, if present.
        smoke: the merge smoke test (for a merged model).
        reports: evaluation reports.
        plot_names: for each report plot, its path in the repository.
    """

    run: RunRecord
    config: dict[str, Any]
    recipe: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    reports: list[Report] = field(default_factory=list)
    plot_names: dict[Path, str] = field(default_factory=dict)


def plot_repo_paths(reports: list[Report]) -> dict[Path, str]:
    """Where each report's PNG plots go in the repository (``plots/NAME.png``, prefixed when several reports).

    Args:
        reports: the evaluation reports.

    Returns:
        ``{local PNG path: path in repo}``.
    """
    names: dict[Path, str] = {}
    used: set[str] = set()
    for report in reports:
        for plot in report.plots:
            name = f"plots/{plot.name}"
            if name in used:
                name = f"plots/{report.label}-{plot.name}"
            used.add(name)
            names[plot] = name
    return names


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def card_inputs(
    folder: str | Path, run: RunRecord, reports: list[Report], smoke: dict[str, Any] | None = None
) -> CardInputs:
    """Gather the card's inputs from a run folder or a merged model folder.

    Args:
        folder: the folder holding ``config.json`` (and, for a run, ``recipe.yaml`` and ``versions.json``).
        run: the run's record.
        reports: evaluation reports to include.
        smoke: the merge smoke test, for a merged model.

    Returns:
        The :class:`CardInputs`.
    """
    folder = Path(folder)
    recipe: dict[str, Any] = {}
    source = run.folder or Path(folder)
    for candidate in (folder / "recipe.yaml", source / "recipe.yaml"):
        if candidate.is_file():
            try:
                loaded = yaml.safe_load(candidate.read_text())
            except yaml.YAMLError:
                loaded = None
            recipe = loaded if isinstance(loaded, dict) else {}
            break
    versions = _read_json(folder / "versions.json") or _read_json(source / "versions.json")
    return CardInputs(
        run=run,
        config=_read_json(folder / "config.json"),
        recipe=recipe,
        versions=versions,
        smoke=smoke or {},
        reports=reports,
        plot_names=plot_repo_paths(reports),
    )


def _tokens(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    n = float(n)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}"


def _dataset_ids(inputs: CardInputs) -> list[str]:
    # The Hub data sets the model was trained or evaluated on.
    ids: list[str] = []
    data = d if isinstance(d := inputs.recipe.get("data"), dict) else {}
    if is_hub_id(data.get("path")):
        ids.append(str(data["path"]))
    for report in inputs.reports:
        ids += [ref for ref in report.data.data_sources() if is_hub_id(ref) and ref not in ids]
    return ids


def eval_results(inputs: CardInputs) -> list[Any]:
    """The ``model-index`` entries: each section's results of the extended model (perplexity, passkey accuracy …).

    Args:
        inputs: the card inputs.

    Returns:
        A list of :class:`huggingface_hub.EvalResult`, as the reports stored them (``card.<section>.results``).
    """
    from huggingface_hub import EvalResult

    return [
        EvalResult(
            task_type="text-generation",
            task_name=r.task,
            dataset_type=r.dataset_type,
            dataset_name=r.dataset_name,
            metric_type=r.metric,
            metric_name=f"{r.label} @ {r.length} tokens",
            metric_value=r.value,
            metric_config=r.length,
        )
        for report in inputs.reports
        for part in report.data.card.values()
        for r in part.results
    ]


def _front_matter(inputs: CardInputs, merged: bool, model_name: str) -> str:
    from huggingface_hub import ModelCardData

    run = inputs.run
    tags = ["context-extension", run.method, "long-context", "rope-scaling", "ctxext"]
    if run.mode == "full":
        tags.append("full-fine-tune")
    elif not merged:
        tags += ["lora", "qlora"] if (run.quantization or "").lower() in ("nf4", "int8") else ["lora"]
    base = run.base_model
    results = eval_results(inputs)
    data = ModelCardData(
        base_model=base if is_hub_id(base) else None,
        library_name="transformers" if merged else "peft",
        pipeline_tag="text-generation",
        tags=list(dict.fromkeys(tags)),
        datasets=_dataset_ids(inputs) or None,
        model_name=model_name if results else None,
        eval_results=results or None,
    )
    return data.to_yaml()


def _title(run: RunRecord, repo_id: str | None) -> str:
    if repo_id:
        return repo_id.split("/")[-1]
    base = run.base_model.rstrip("/").split("/")[-1] or "model"
    if not run.target_length:
        return f"{base}-ctxext"
    return f"{base}-{run.method}-{_tokens(run.target_length)}"


def _summary(inputs: CardInputs, merged: bool) -> list[str]:
    run = inputs.run
    base = run.base_model
    original, target = run.original_length, run.target_length
    factor = (inputs.config.get("ctxext") or {}).get("factor") or (
        target / original if isinstance(target, int) and isinstance(original, int) and original else None
    )
    kind = "a merged model (LoRA and trained modules folded into the base weights)" if merged else "a LoRA adapter"
    if run.mode == "full":
        kind = "a full fine-tune (every weight trained)"
    if run.method == "none" or not target:
        what = f"`{base}` fine-tuned at {run.seq_len} tokens with its RoPE unchanged"
    else:
        what = (
            f"`{base}` extended from **{original}** to **{target}** tokens with **{run.method}** RoPE scaling"
            + (f" (factor ×{fmt(float(factor), 4)})" if factor else "")
            + f", then fine-tuned at {run.seq_len or target} tokens"
        )
    lines = [
        f"{what}. This repository holds {kind}.",
        "",
        "Made with ctxext, which verifies the runtime RoPE against an independent reference of the method's "
        "frequencies after every load and merge.",
    ]
    if not inputs.run.complete:
        lines += [
            "",
            f"> **Warning:** this was published from an unfinished training run (status `{run.status}`, "
            f"{run.steps} steps). Its numbers are not final.",
        ]
    return lines


def _model_section(inputs: CardInputs) -> list[str]:
    run = inputs.run
    params = rope_parameters(inputs.run, inputs.config)
    meta = inputs.config.get("ctxext") or {}
    rows = [
        ("base model", f"`{run.base_model}`"),
        *_gguf_row(run),
        ("original context", str(run.original_length)),
        ("extended context", str(run.target_length)),
        ("method", f"`{run.method}`"),
        ("factor", fmt(float(meta["factor"]), 4) if meta.get("factor") else "-"),
        ("max_position_embeddings", str(inputs.config.get("max_position_embeddings", "-"))),
    ]
    rows += [(f"rope_parameters.{k}", f"`{json.dumps(v)}`") for k, v in sorted(params.items())]
    lines = ["## Model", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return lines


def _gguf_row(run: RunRecord) -> list[tuple[str, str]]:
    # A base converted from a GGUF file: which file, exactly (its dequantized weights, not the original ones).
    gguf = run.base_gguf
    if not isinstance(gguf, dict):
        return []
    return [("base GGUF file", f"`{gguf.get('file')}` (dequantized to float32; `{gguf.get('sha256')}`)")]


def _recipe_section(inputs: CardInputs) -> list[str]:
    run, recipe = inputs.run, inputs.recipe
    lora = run.lora.model_dump(exclude_none=True) if run.lora is not None else recipe.get("lora") or {}
    lora = {} if run.mode == "full" else lora  # a full fine-tune's recipe dump still carries lora's defaults
    train = t if isinstance(t := recipe.get("train"), dict) else {}
    data = d if isinstance(d := recipe.get("data"), dict) else {}
    extra = run.extra_trainable or lora.get("extra_trainable") or []
    rows = [
        ("steps", run.steps),
        ("tokens seen", _tokens(run.tokens_seen)),
        ("sequence length", run.seq_len),
        ("base weights during training", run.quantization),
        ("training mode", run.mode),
        (
            "LoRA rank / alpha / dropout",
            f"{lora.get('r', '?')} / {lora.get('alpha', lora.get('lora_alpha', '?'))} / "
            f"{lora.get('dropout', lora.get('lora_dropout', '?'))}"
            if lora
            else None,
        ),
        ("LoRA target modules", (", ".join(lora.get("target_modules") or []) or "-") if lora else None),
        ("trained in full", "every weight" if run.mode == "full" else ", ".join(extra) or "-"),
        (
            "learning rate / schedule",
            f"{train.get('learning_rate', '?')} / {train.get('scheduler', '?')}" if train else None,
        ),
        (
            "batch (micro × accumulation)",
            f"{train.get('micro_batch_size')} × {train.get('gradient_accumulation_steps')}" if train else None,
        ),
        ("training data", f"`{data.get('path')}`" if data.get("path") else None),
        (
            "final train / validation loss",
            " / ".join(
                fmt(float(v), 4) if isinstance(v, (int, float)) else "-"
                for v in (run.final_train_loss, run.final_val_loss)
            ),
        ),
    ]
    lines = ["## Training", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows if v is not None]
    lines += ["", "The full resolved recipe is `recipe.yaml` in this repository: `ctxext train recipe.yaml` reruns it."]
    if inputs.versions:
        libs = inputs.versions.get("libraries")
        libs = libs if isinstance(libs, dict) else inputs.versions
        pinned = ", ".join(f"{k} {v}" for k, v in sorted(libs.items()) if isinstance(v, str))
        if pinned:
            lines += ["", f"Software: {pinned}."]
    return lines


def _eval_section(inputs: CardInputs) -> list[str]:
    lines = ["## Evaluation", ""]
    if not inputs.reports:
        return lines + [
            "No evaluation report was published with this model. `ctxext eval run eval/long-context.yaml "
            "--model <this repo>` measures perplexity by length and position and passkey retrieval."
        ]
    for report in inputs.reports:
        if len(inputs.reports) > 1:
            lines += [f"### {report.label}", ""]
        stopped = (report.data.suite or {}).get("interrupted")
        if stopped:  # an evaluation cut short wrote what completed; the card must not read as the whole of it
            lines += [f"**Incomplete evaluation: {stopped}.**", ""]
        # Each section's rows as it rendered them when the report was written (the tables of report.md).
        for part in report.data.card.values():
            lines += part.rows
        plots = [p for p in report.plots if p in inputs.plot_names]
        lines += [f"![{plot.stem}]({inputs.plot_names[plot]})" for plot in plots]
        lines.append("")
    return lines


def _short_context_section(inputs: CardInputs) -> list[str]:
    lines = ["## Short-context cost", ""]
    for report in inputs.reports:
        cost = next((part.cost for part in report.data.card.values() if part.cost), None)
        if cost:
            return lines + cost
    return lines + [
        "Not measured: no report compares this model with the unmodified base at the original context. "
        "Run `ctxext eval` with the base model as a second `--model` (or `eval.compare_base: true` in the recipe)."
    ]


def _smoke_section(inputs: CardInputs) -> list[str]:
    smoke = inputs.smoke
    if not smoke:
        return []
    lines = ["## Merge check", ""]
    n, length = int(smoke.get("sequences") or 1), smoke.get("length")
    short = smoke.get("check_length") or length
    where = f"one random sequence of {length} tokens" + (f" and {n - 1} of {short}" if n > 1 else "")
    reference = "the trained model" if inputs.run.mode == "full" else "base + adapter"
    lines.append(
        f"After merging, the saved model was reloaded with plain transformers, its RoPE verified, and its logits "
        f"compared with {reference} on {where}: "
        f"max |Δlogit| = {smoke.get('max_abs_diff', float('nan')):.3g} (tolerance {smoke.get('tolerance')}, "
        f"{smoke.get('dtype')}). Perplexity on {smoke.get('ppl_tokens')} tokens of standard-library source: "
        f"{fmt(smoke.get('ppl'), 4)} merged vs "
        f"{fmt(smoke.get('reference_ppl'), 4)} {reference}."
    )
    if smoke.get("embeddings") == "tied":
        lines += ["", "The input and output embeddings are tied (one matrix), as in the base model."]
    elif smoke.get("embeddings") == "untied":
        lines += [
            "",
            "**Untied embeddings.** The base ties its input and output embeddings; this adapter trained the input "
            "embeddings as a separate copy, so the merged model stores the output matrix separately "
            "(`tie_word_embeddings: false`, one more vocabulary × hidden matrix) with the base's original values.",
        ]
    t = smoke.get("attention_temperature", 1.0)
    if t != 1.0:
        lines += [
            "",
            f"Every attention logit is multiplied by {t:g} (chosen by `ctxext calibrate` on held-out text): the factor "
            "is folded into the query projections, so the model needs no setting to run with it.",
        ]
    return lines


def render_card(inputs: CardInputs, merged: bool = False, repo_id: str | None = None) -> str:
    """Render the model card text from gathered inputs.

    Args:
        inputs: see :func:`card_inputs`.
        merged: the repository holds a merged model (``library_name: transformers``) rather than an adapter.
        repo_id: the target repository (used in the snippets); a placeholder when not known.

    Returns:
        The README.md text, YAML front matter first.
    """
    title = _title(inputs.run, repo_id)
    ref = repo_id or f"<user>/{title}"
    parts = [
        "---",
        _front_matter(inputs, merged, title).rstrip(),
        "---",
        "",
        f"# {title}",
        "",
        *_summary(inputs, merged),
        "",
        *_model_section(inputs),
        "",
        *_recipe_section(inputs),
        "",
        *_eval_section(inputs),
        *_short_context_section(inputs),
        "",
        *_smoke_section(inputs),
        "",
        *load_section(inputs.run, merged, ref),
        "",
        *serving_section(inputs.run, inputs.config, merged, ref),
        "",
    ]
    text = "\n".join(parts)
    return re.sub(r"\n{3,}", "\n\n", text)


def build_model_card(
    run_dir: str | Path,
    reports: list[Report | str | Path] | None = None,
    merged: bool = False,
    repo_id: str | None = None,
    allow_incomplete: bool = False,
) -> str:
    """Generate the ``README.md`` model card of a run folder (adapter) or a merged model folder.

    Args:
        run_dir: a run folder written by ``ctxext train``, or a folder written by ``ctxext merge``.
        reports: evaluation reports (``Report`` objects or paths); ``None``: the reports found in the folder.
        merged: describe a merged model; implied for a merged folder.
        repo_id: the target Hub repository, used in the loading snippets.
        allow_incomplete: accept an unfinished run (the card then says so).

    Returns:
        The card text.
    """
    from ctxext.artifacts.run import find_reports, is_merged_folder, load_report, read_merged, read_run

    folder = Path(run_dir)
    smoke: dict[str, Any] = {}
    if is_merged_folder(folder):
        meta = read_merged(folder)
        run, smoke, merged = meta.run, meta.smoke, True
    else:
        run = read_run(folder, allow_incomplete=allow_incomplete)
    if reports is None:
        loaded = find_reports(folder)
    else:
        loaded = [r if isinstance(r, Report) else load_report(r) for r in reports]
    return render_card(card_inputs(folder, run, loaded, smoke), merged=merged, repo_id=repo_id)
