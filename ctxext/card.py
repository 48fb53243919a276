"""The model card (``README.md``) of a published extension: Hub metadata plus what a user needs to trust and use it.

The YAML front matter is built with huggingface_hub's :class:`~huggingface_hub.ModelCardData` and
:class:`~huggingface_hub.EvalResult`, so ``model-index`` has exactly the structure the Hub reads
(perplexity per length and passkey accuracy show up as evaluation results on the model page).

The prose says what was changed (method, factor, every rope parameter), how it was trained, how it
scored (tables and plots from ``ctxext eval`` reports), what it cost at the original context, and how
to load and serve it with the right RoPE — the step users most often get wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ctxext.runfolder import Report

# Hub ids: "name" or "org/name", letters, digits, "-", "_", "." (no "..", no leading/trailing separator).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
_DIGITS = re.compile(r"\d+")


def looks_like_hub_id(ref: str | None) -> bool:
    """Whether ``ref`` could name a Hub repository (``org/name``), as opposed to a local path or ``builtin:``."""
    if not ref or ref.startswith(("/", ".", "~", "builtin:")) or "\\" in ref or ".." in ref:
        return False
    return ref.count("/") == 1 and bool(_HUB_ID.match(ref)) and not Path(ref).exists()


# ---------------------------------------------------------------------------------------------
# Reading evaluation reports (tolerant: several report layouts carry the same numbers)
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelResults:
    """The numbers of one evaluated model in a report.

    Attributes:
        name: the model's label in the report.
        ppl: perplexity by evaluation length.
        ppl_ci: 95% interval by length, when the report has one.
        tokens: scored tokens by length.
        documents: documents by length.
        passkey: passkey accuracy (0–1) by length, averaged over depths.
        passkey_grid: accuracy by length, then by depth (percent).
        buckets: perplexity by position bucket.
        beyond: lengths evaluated beyond the model's configured context.
        short_context: ``(length, ppl)`` at the model's original length, when the report measured it.
        needle: needle-in-a-haystack accuracy by length; ``needle_grid`` by length and depth.
        qa: long-document QA overall scores (``exact_match``, ``f1``, ``examples``).
        is_base: the unmodified base model (no adapter, no patched config), when the report says.
        protocol: the perplexity protocol the report states.
    """

    name: str
    ppl: dict[int, float] = field(default_factory=dict)
    ppl_ci: dict[int, tuple[float, float]] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    documents: dict[int, int] = field(default_factory=dict)
    passkey: dict[int, float] = field(default_factory=dict)
    passkey_grid: dict[int, dict[float, float]] = field(default_factory=dict)
    buckets: list[dict[str, Any]] = field(default_factory=list)
    beyond: set[int] = field(default_factory=set)
    short_context: tuple[int, float] | None = None
    needle: dict[int, float] = field(default_factory=dict)
    needle_grid: dict[int, dict[float, float]] = field(default_factory=dict)
    qa: dict[str, Any] | None = None
    is_base: bool | None = None
    protocol: str | None = None

    @property
    def empty(self) -> bool:
        """No perplexity, passkey or bucket numbers."""
        return not (self.ppl or self.passkey or self.buckets or self.needle or self.qa)


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        for key in ("accuracy", "acc", "value", "mean", "ppl"):
            if key in value and isinstance(value[key], (int, float)):
                return float(value[key])
    return None


def _accuracy(value: Any) -> float | None:
    acc = _num(value)
    if acc is None:
        return None
    # Some reports give percentages; normalise to 0-1.
    return acc / 100.0 if acc > 1.0 else acc


def _int_key(key: Any) -> int | None:
    try:
        return int(float(key))
    except (TypeError, ValueError):
        return None


def _parse_ppl(section: Any, out: ModelResults) -> None:
    if not isinstance(section, dict):
        return
    for key, entry in (section.get("by_length") or {}).items():
        length = _int_key(key)
        if length is None or not isinstance(entry, dict) or not isinstance(entry.get("ppl"), (int, float)):
            continue
        out.ppl[length] = float(entry["ppl"])
        if entry.get("tokens") is not None:
            out.tokens[length] = int(entry["tokens"])
        if entry.get("documents") is not None:
            out.documents[length] = int(entry["documents"])
        ci = entry.get("ppl_ci") or entry.get("ci95") or entry.get("ci") or (entry.get("ci_low"), entry.get("ci_high"))
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci):
            out.ppl_ci[length] = (float(ci[0]), float(ci[1]))
        if entry.get("beyond_context"):
            out.beyond.add(length)
    short = section.get("short_context")
    if isinstance(short, dict) and isinstance(short.get("ppl"), (int, float)) and short.get("length"):
        out.short_context = (int(short["length"]), float(short["ppl"]))
    buckets = section.get("by_bucket")
    if isinstance(buckets, list):
        out.buckets = [b for b in buckets if isinstance(b, dict) and "start" in b and "ppl" in b]


def _parse_grid(section: Any) -> tuple[dict[int, float], dict[int, dict[float, float]]]:
    # Accuracy by length and by (length, depth) of a passkey or needle section, in any of the layouts.
    by_length: dict[int, float] = {}
    by_cell: dict[int, dict[float, float]] = {}
    if not isinstance(section, dict):
        return by_length, by_cell
    grid: dict[int, dict[float, float]] = {}
    # Cells as a list of {length, depth, accuracy | correct}.
    for list_key in ("cells", "grid", "results", "trials", "by_length_depth"):
        rows = section.get(list_key)
        if isinstance(rows, list):
            sums: dict[tuple[int, float], list[float]] = {}
            for row in rows:
                if not isinstance(row, dict):
                    continue
                length = _int_key(row.get("length"))
                depth = row.get("depth", row.get("depth_percent"))
                acc = _accuracy(row.get("accuracy", row.get("correct")))
                if length is None or acc is None:
                    continue
                sums.setdefault((length, float(depth if depth is not None else -1)), []).append(acc)
            for (length, depth), values in sums.items():
                grid.setdefault(length, {})[depth] = sum(values) / len(values)
    # Nested {length: {depth: accuracy}} or {length: accuracy}.
    for map_key in ("grid", "accuracy", "by_length", "by_length_depth"):
        mapping = section.get(map_key)
        if not isinstance(mapping, dict):
            continue
        for lkey, value in mapping.items():
            length = _int_key(lkey)
            if length is None:
                continue
            if isinstance(value, dict) and _num(value) is None:
                inner = value.get("by_depth", value)
                for dkey, cell in inner.items() if isinstance(inner, dict) else []:
                    depth, acc = _int_key(dkey), _accuracy(cell)
                    if depth is not None and acc is not None:
                        grid.setdefault(length, {})[float(dkey)] = acc
            else:
                acc = _accuracy(value)
                if acc is not None:
                    by_length[length] = acc
    for length, cells in grid.items():
        real = {d: a for d, a in cells.items() if d >= 0}
        if real:
            by_cell[length] = dict(sorted(real.items()))
        by_length.setdefault(length, sum(cells.values()) / len(cells))
    return dict(sorted(by_length.items())), by_cell


def _sections(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    # Layout A: {"models": [{"name", "perplexity", "passkey"}, ...]} (side-by-side evaluation).
    models = report.get("models")
    if isinstance(models, list) and any(isinstance(m, dict) and ("perplexity" in m or "passkey" in m) for m in models):
        return [
            (str(m.get("name") or m.get("label") or m.get("model") or f"model {i + 1}"), m)
            for i, m in enumerate(models)
            if isinstance(m, dict)
        ]
    # Layout B: {"results": {name: {"perplexity", "passkey"}}}.
    results = report.get("results")
    if isinstance(results, dict) and all(isinstance(v, dict) for v in results.values()) and results:
        return [(str(k), v) for k, v in results.items()]
    # Layout C: per-model sections keyed by name inside "perplexity" / "passkey".
    ppl = report.get("perplexity")
    if isinstance(ppl, dict) and "by_length" not in ppl and ppl and all(isinstance(v, dict) for v in ppl.values()):
        names = list(ppl)
        passkey = pk if isinstance(pk := report.get("passkey"), dict) else {}
        return [(n, {"perplexity": ppl[n], "passkey": passkey.get(n)}) for n in names]
    # Layout D: one model at top level.
    name = report.get("model")
    if isinstance(name, dict):
        name = name.get("name") or name.get("ref")
    if not name and isinstance(models, list) and len(models) == 1:
        first = models[0]
        name = first if isinstance(first, str) else (first.get("name") if isinstance(first, dict) else None)
    return [(str(name or "this model"), report)]


def model_results(report: dict[str, Any]) -> list[ModelResults]:
    """Every model's numbers in a ``ctxext eval`` report.

    Args:
        report: a parsed ``report.json``.

    Returns:
        One :class:`ModelResults` per model with at least one number.
    """
    out = []
    for name, section in _sections(report):
        results = ModelResults(name=name)
        _parse_ppl(section.get("perplexity"), results)
        results.passkey, results.passkey_grid = _parse_grid(section.get("passkey"))
        results.needle, results.needle_grid = _parse_grid(section.get("needle"))
        qa = section.get("qa")
        if isinstance(qa, dict) and isinstance(qa.get("overall"), dict):
            results.qa = qa["overall"]
        info = section.get("model")
        if isinstance(info, dict) and ("adapter" in info or "config_from" in info):
            # ctxext.eval reports say how each model was loaded: the base has neither adapter nor patch.
            results.is_base = not info.get("adapter") and not info.get("config_from")
        ppl = section.get("perplexity")
        if isinstance(ppl, dict) and isinstance(ppl.get("protocol"), str):
            results.protocol = ppl["protocol"]
        if not results.empty:
            out.append(results)
    return out


def _is_base(name: str) -> bool:
    lowered = name.lower()
    return "base" in lowered and "+" not in lowered and "adapter" not in lowered


def split_base(results: list[ModelResults]) -> tuple[ModelResults | None, ModelResults | None]:
    """Pick the extended model's results and the unmodified base's (for the short-context cost).

    Args:
        results: the models of one report.

    Returns:
        ``(extended, base)``; the extended one is the last non-base model (fine-tuned after patched-only).
    """
    base = next((r for r in results if (r.is_base if r.is_base is not None else _is_base(r.name))), None)
    others = [r for r in results if r is not base]
    return (others[-1] if others else None), base


# ---------------------------------------------------------------------------------------------
# The card
# ---------------------------------------------------------------------------------------------


@dataclass
class CardInputs:
    """Everything the card is built from.

    Attributes:
        run: the run's ``run.json`` content.
        config: the patched ``config.json`` content.
        recipe: the run's resolved recipe (``recipe.yaml``), if present.
        versions: ``versions.json``, if present.
        smoke: the merge smoke test (for a merged model).
        reports: evaluation reports.
        plot_names: for each report plot, its path in the repository.
    """

    run: dict[str, Any]
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
    folder: str | Path, run: dict[str, Any], reports: list[Report], smoke: dict[str, Any] | None = None
) -> CardInputs:
    """Gather the card's inputs from a run folder or a merged model folder.

    Args:
        folder: the folder holding ``config.json`` (and, for a run, ``recipe.yaml`` and ``versions.json``).
        run: the run's ``run.json`` content.
        reports: evaluation reports to include.
        smoke: the merge smoke test, for a merged model.

    Returns:
        The :class:`CardInputs`.
    """
    folder = Path(folder)
    recipe: dict[str, Any] = {}
    source = Path(run.get("run_dir") or folder)
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


def _fmt(value: float, digits: int = 4) -> str:
    return f"{value:.{digits}g}"


def _tokens(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    n = float(n)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}"


def _rope_parameters(inputs: CardInputs) -> dict[str, Any]:
    params = inputs.config.get("rope_parameters") or inputs.run.get("rope_parameters") or {}
    return dict(params) if isinstance(params, dict) else {}


def _dataset_ids(inputs: CardInputs) -> list[str]:
    ids: list[str] = []
    data = d if isinstance(d := inputs.recipe.get("data"), dict) else {}
    if looks_like_hub_id(data.get("path")):
        ids.append(str(data["path"]))
    for report in inputs.reports:
        ref = _report_data_ref(report)
        if ref and looks_like_hub_id(ref) and ref not in ids:
            ids.append(ref)
    return ids


def _report_data_ref(report: Report) -> str | None:
    # ctxext.eval.report/v1 keeps {"data": {"perplexity": {"source": ...}}}; older layouts a path or name.
    ref = report.data.get("data")
    if isinstance(ref, dict) and isinstance(ref.get("perplexity"), dict):
        ref = ref["perplexity"]
    if isinstance(ref, dict):
        ref = ref.get("source") or ref.get("path") or ref.get("name")
    return ref if isinstance(ref, str) and ref else None


def _eval_dataset(report: Report, inputs: CardInputs) -> tuple[str, str]:
    # (dataset_type, dataset_name) of a report's perplexity data for model-index.
    ref = _report_data_ref(report)
    if isinstance(ref, str) and ref:
        if looks_like_hub_id(ref):
            return ref, ref
        return "text", Path(ref).name or ref
    return "text", "held-out long documents"


def eval_results(inputs: CardInputs) -> list[Any]:
    """The ``model-index`` entries: perplexity per length and passkey accuracy per length of the extended model.

    Args:
        inputs: the card inputs.

    Returns:
        A list of :class:`huggingface_hub.EvalResult`.
    """
    from huggingface_hub import EvalResult

    out: list[Any] = []
    for report in inputs.reports:
        extended, _ = split_base(model_results(report.data))
        if extended is None:
            continue
        dtype, dname = _eval_dataset(report, inputs)
        for length, ppl in sorted(extended.ppl.items()):
            out.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="Long-context language modeling",
                    dataset_type=dtype,
                    dataset_name=dname,
                    metric_type="perplexity",
                    metric_name=f"Perplexity @ {length} tokens",
                    metric_value=round(float(ppl), 4),
                    metric_config=str(length),
                )
            )
        for length, acc in sorted(extended.passkey.items()):
            out.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="Passkey retrieval",
                    dataset_type="passkey",
                    dataset_name="Passkey retrieval (synthetic, landmark-attention prompt)",
                    metric_type="accuracy",
                    metric_name=f"Passkey accuracy @ {length} tokens",
                    metric_value=round(100.0 * float(acc), 2),
                    metric_config=str(length),
                )
            )
    return out


def _front_matter(inputs: CardInputs, merged: bool, model_name: str) -> str:
    from huggingface_hub import ModelCardData

    run = inputs.run
    method = str(run.get("method") or "rope")
    tags = ["context-extension", method, "long-context", "rope-scaling", "ctxext"]
    if not merged:
        tags += ["lora", "qlora"] if str(run.get("quantization") or "").lower() in ("nf4", "int8") else ["lora"]
    base = run.get("base_model")
    results = eval_results(inputs)
    data = ModelCardData(
        base_model=base if looks_like_hub_id(base) else None,
        library_name="transformers" if merged else "peft",
        pipeline_tag="text-generation",
        tags=list(dict.fromkeys(tags)),
        datasets=_dataset_ids(inputs) or None,
        model_name=model_name if results else None,
        eval_results=results or None,
    )
    return data.to_yaml()


def _title(run: dict[str, Any], repo_id: str | None) -> str:
    if repo_id:
        return repo_id.split("/")[-1]
    base = str(run.get("base_model") or "model").rstrip("/").split("/")[-1]
    if not run.get("target_length"):
        return f"{base}-ctxext"
    return f"{base}-{run.get('method')}-{_tokens(run.get('target_length'))}"


def _summary(inputs: CardInputs, merged: bool) -> list[str]:
    run = inputs.run
    base = run.get("base_model")
    original, target = run.get("original_length"), run.get("target_length")
    factor = (inputs.config.get("ctxext") or {}).get("factor") or (
        target / original if isinstance(target, int) and isinstance(original, int) and original else None
    )
    kind = "a merged model (LoRA and trained modules folded into the base weights)" if merged else "a LoRA adapter"
    if run.get("method") in (None, "none") or not target:
        what = f"`{base}` fine-tuned at {run.get('seq_len')} tokens with its RoPE unchanged"
    else:
        what = (
            f"`{base}` extended from **{original}** to **{target}** tokens with **{run.get('method')}** RoPE scaling"
            + (f" (factor ×{_fmt(float(factor))})" if factor else "")
            + f", then fine-tuned at {run.get('seq_len') or target} tokens"
        )
    lines = [
        f"{what}. This repository holds {kind}.",
        "",
        "Made with ctxext, which verifies the runtime RoPE against an independent reference of the method's "
        "frequencies after every load and merge.",
    ]
    if inputs.run.get("status") != "complete":
        lines += [
            "",
            f"> **Warning:** this was published from an unfinished training run (status `{run.get('status')}`, "
            f"{run.get('steps')} steps). Its numbers are not final.",
        ]
    return lines


def _model_section(inputs: CardInputs) -> list[str]:
    run = inputs.run
    params = _rope_parameters(inputs)
    meta = inputs.config.get("ctxext") or {}
    rows = [
        ("base model", f"`{run.get('base_model')}`"),
        ("original context", str(run.get("original_length"))),
        ("extended context", str(run.get("target_length"))),
        ("method", f"`{run.get('method')}`"),
        ("factor", _fmt(float(meta["factor"])) if meta.get("factor") else "-"),
        ("max_position_embeddings", str(inputs.config.get("max_position_embeddings", "-"))),
    ]
    rows += [(f"rope_parameters.{k}", f"`{json.dumps(v)}`") for k, v in sorted(params.items())]
    lines = ["## Model", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return lines


def _recipe_section(inputs: CardInputs) -> list[str]:
    run, recipe = inputs.run, inputs.recipe
    lora = lo if isinstance(lo := run.get("lora"), dict) else recipe.get("lora") or {}
    train = t if isinstance(t := recipe.get("train"), dict) else {}
    data = d if isinstance(d := recipe.get("data"), dict) else {}
    extra = run.get("extra_trainable") or lora.get("extra_trainable") or []
    rows = [
        ("steps", run.get("steps")),
        ("tokens seen", _tokens(run.get("tokens_seen"))),
        ("sequence length", run.get("seq_len")),
        ("base weights during training", run.get("quantization")),
        (
            "LoRA rank / alpha / dropout",
            f"{lora.get('r', '?')} / {lora.get('alpha', lora.get('lora_alpha', '?'))} / "
            f"{lora.get('dropout', lora.get('lora_dropout', '?'))}",
        ),
        ("LoRA target modules", ", ".join(lora.get("target_modules") or []) or "-"),
        ("trained in full", ", ".join(extra) or "-"),
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
                _fmt(float(v)) if isinstance(v, (int, float)) else "-"
                for v in (run.get("final_train_loss"), run.get("final_val_loss"))
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


def _ppl_table(models: list[ModelResults]) -> list[str]:
    lengths = sorted({length for m in models for length in m.ppl})
    if not lengths:
        return []
    lines = ["| model | " + " | ".join(f"{length}" for length in lengths) + " |"]
    lines.append("| --- |" + " --- |" * len(lengths))
    for m in models:
        cells = []
        for length in lengths:
            if length not in m.ppl:
                cells.append("-")
            elif length in m.ppl_ci:
                lo, hi = m.ppl_ci[length]
                cells.append(f"{_fmt(m.ppl[length])} ({_fmt(lo, 3)}–{_fmt(hi, 3)})")
            else:
                cells.append(_fmt(m.ppl[length]))
            if length in m.beyond:
                cells[-1] += " †"
        lines.append(f"| {m.name} | " + " | ".join(cells) + " |")
    return lines


def _grid_tables(models: list[ModelResults], task: str = "passkey", title: str = "Passkey accuracy") -> list[str]:
    lines: list[str] = []
    for m in models:
        by_length, grid = getattr(m, task), getattr(m, f"{task}_grid")
        if not by_length:
            continue
        depths = sorted({d for cells in grid.values() for d in cells})
        lines += ["", f"{title}, {m.name}:", ""]
        header = "| length | " + " | ".join(f"depth {d:g}%" for d in depths) + (" | " if depths else "") + "mean |"
        lines += [header, "| --- |" + " --- |" * (len(depths) + 1)]
        for length, acc in sorted(by_length.items()):
            cells = [f"{100 * grid.get(length, {})[d]:.0f}%" if d in grid.get(length, {}) else "-" for d in depths]
            lines.append(f"| {length} | " + " | ".join(cells) + (" | " if cells else "") + f"{100 * acc:.0f}% |")
    return lines


def _bucket_table(models: list[ModelResults]) -> list[str]:
    with_buckets = [m for m in models if m.buckets]
    if not with_buckets:
        return []
    spans = sorted({(int(b["start"]), int(b["end"])) for m in with_buckets for b in m.buckets})
    lines = ["", "Perplexity by position of the predicted token:", ""]
    lines += ["| positions | " + " | ".join(m.name for m in with_buckets) + " |"]
    lines += ["| --- |" + " --- |" * len(with_buckets)]
    for start, end in spans:
        cells = []
        for m in with_buckets:
            hit = next((b for b in m.buckets if int(b["start"]) == start and int(b["end"]) == end), None)
            cells.append(_fmt(float(hit["ppl"])) if hit else "-")
        lines.append(f"| {start}–{end} | " + " | ".join(cells) + " |")
    return lines


def _eval_section(inputs: CardInputs) -> list[str]:
    lines = ["## Evaluation", ""]
    if not inputs.reports:
        return lines + [
            "No evaluation report was published with this model. `ctxext eval run eval/long-context.yaml "
            "--model <this repo>` measures perplexity by length and position and passkey retrieval."
        ]
    for report in inputs.reports:
        models = model_results(report.data)
        if len(inputs.reports) > 1:
            lines += [f"### {report.label}", ""]
        protocol = report.data.get("protocol") or next((m.protocol for m in models if m.protocol), None)
        if isinstance(protocol, str):
            lines += [f"Protocol: {protocol}", ""]
        elif isinstance(protocol, dict):
            lines += ["Protocol: " + "; ".join(f"{k}: {v}" for k, v in protocol.items()), ""]
        data = _report_data_ref(report)
        if data:
            lines += [f"Data: `{data}`", ""]
        table = _ppl_table(models)
        if table:
            lines += ["Perplexity by evaluation length (lower is better; 95% interval in brackets where measured):", ""]
            lines += table
            if any(m.beyond for m in models):
                lines += ["", "† beyond that model's configured context."]
        lines += _bucket_table(models)
        lines += _grid_tables(models)
        lines += _grid_tables(models, "needle", "Needle-in-a-haystack accuracy")
        qa = [(m.name, m.qa) for m in models if m.qa]
        if qa:
            lines += ["", "Long-document QA (exact match / F1, %):", ""]
            lines += [
                f"- {name}: {_fmt(float(q.get('exact_match', math.nan)), 3)} / "
                f"{_fmt(float(q.get('f1', math.nan)), 3)} ({q.get('examples', '?')} questions)"
                for name, q in qa
            ]
        plots = [p for p in report.plots if p in inputs.plot_names]
        if plots:
            lines.append("")
            for plot in plots:
                lines.append(f"![{plot.stem}]({inputs.plot_names[plot]})")
        lines.append("")
    return lines


def _short_context_section(inputs: CardInputs) -> list[str]:
    original = inputs.run.get("original_length")
    lines = ["## Short-context cost", ""]
    for report in inputs.reports:
        extended, base = split_base(model_results(report.data))
        if extended is None or base is None:
            continue
        if extended.short_context and base.short_context and extended.short_context[0] == base.short_context[0]:
            length, e = extended.short_context
            b = base.short_context[1]
            return lines + [
                f"Perplexity at the original context ({length} tokens), base model vs this model:",
                "",
                "| length | base | this model | change |",
                "| --- | --- | --- | --- |",
                f"| {length} | {_fmt(b)} | {_fmt(e)} | {100 * (e - b) / b:+.1f}% |",
            ]
        short = sorted(
            length for length in set(extended.ppl) & set(base.ppl) if not original or length <= int(original)
        )
        if not short:
            continue
        lines += [
            f"Perplexity within the original context ({original} tokens), base model vs this model:",
            "",
            "| length | base | this model | change |",
            "| --- | --- | --- | --- |",
        ]
        for length in short:
            b, e = base.ppl[length], extended.ppl[length]
            lines.append(f"| {length} | {_fmt(b)} | {_fmt(e)} | {100 * (e - b) / b:+.1f}% |")
        return lines
    return lines + [
        "Not measured: no report compares this model with the unmodified base at the original context. "
        "Run `ctxext eval` with the base model as a second `--model` (or `eval.compare_base: true` in the recipe)."
    ]


def _load_section(inputs: CardInputs, merged: bool, repo_id: str) -> list[str]:
    run = inputs.run
    base = run.get("base_model")
    target = run.get("target_length")
    if merged:
        code = [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}", dtype="auto", attn_implementation="sdpa")',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "# config.json carries rope_parameters; transformers >= 5 builds the scaled RoPE from it.",
            "```",
        ]
        note: list[str] = []
    else:
        code = [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer",
            "",
            f"# the patched config: rope_parameters for {target} tokens",
            f'config = AutoConfig.from_pretrained("{repo_id}")',
            f'base = AutoModelForCausalLM.from_pretrained("{base}", config=config, dtype="auto", '
            'attn_implementation="sdpa")',
            f'model = PeftModel.from_pretrained(base, "{repo_id}")  # LoRA + trained embeddings/norms',
            f'tokenizer = AutoTokenizer.from_pretrained("{repo_id}")',
            "```",
        ]
        note = [
            "",
            "Pass the config from this repository: `AutoPeftModelForCausalLM.from_pretrained` (or loading the base "
            "without it) builds the base model's **unscaled** RoPE and silently degrades every input longer than "
            f"{run.get('original_length')} tokens. `ctxext inspect` / `ctxext.verify_model_rope(model)` checks a "
            "loaded model.",
        ]
    if not merged and not looks_like_hub_id(base):
        note += [
            "",
            f"`{base}` is not a Hub id (training used a local or built-in model): replace it with the base "
            "checkpoint's Hub id or folder.",
        ]
    return ["## How to load", "", *code, *note]


def _serving_section(inputs: CardInputs, merged: bool, repo_id: str) -> list[str]:
    from ctxext.rope import legacy_fields

    params = _rope_parameters(inputs)
    target = inputs.run.get("target_length")
    max_pos = inputs.config.get("max_position_embeddings") or target
    overrides = json.dumps({"rope_parameters": params, "max_position_embeddings": max_pos})
    lines = ["## Serving", ""]
    if not merged:
        lines += [
            "This adapter also carries fully trained embedding and norm weights, which LoRA serving does not apply: "
            "serve the merged model (`ctxext merge RUN --out DIR`, then push it with `--merged`).",
            "",
        ]
    serve_ref = repo_id if merged else "<merged model>"
    lines += [
        "The RoPE settings (`rope_parameters`), to pass to engines that do not read them from `config.json`:",
        "",
        "```json",
        json.dumps(params, indent=2),
        "```",
        "",
        "vLLM:",
        "",
        "```bash",
        f"vllm serve {serve_ref} --max-model-len {target} \\",
        f"  --hf-overrides '{overrides}'",
        "```",
    ]
    legacy = legacy_fields(params)
    legacy_overrides = json.dumps({**legacy, "max_position_embeddings": max_pos})
    lines += [
        "",
        "Engines built on transformers < 5 read `rope_scaling` / `rope_theta` instead:",
        "",
        "```bash",
        f"vllm serve {serve_ref} --max-model-len {target} \\",
        f"  --hf-overrides '{legacy_overrides}'",
        "```",
    ]
    if params.get("rope_type") in ("dynamic", "longrope"):
        lines += [
            "",
            f"Note: `{params['rope_type']}` frequencies depend on the sequence length; with a KV cache the keys "
            "of earlier tokens keep the frequencies they were computed with (transformers#25104), so cached and "
            "uncached generation can differ.",
        ]
    if max_pos != target:
        lines += ["", f"`max_position_embeddings` is {max_pos}; pass `--max-model-len {target}` explicitly."]
    return lines


def _smoke_section(inputs: CardInputs) -> list[str]:
    smoke = inputs.smoke
    if not smoke:
        return []
    lines = ["## Merge check", ""]
    lines.append(
        f"After merging, the saved model was reloaded with plain transformers, its RoPE verified, and its logits "
        f"compared with base + adapter on {smoke.get('sequences')} random sequences of {smoke.get('length')} tokens: "
        f"max |Δlogit| = {smoke.get('max_abs_diff', float('nan')):.3g} (tolerance {smoke.get('tolerance')}, "
        f"{smoke.get('dtype')}). Perplexity on {smoke.get('ppl_tokens')} tokens of standard-library source: "
        f"{_fmt(float(smoke.get('ppl', math.nan)))} merged vs "
        f"{_fmt(float(smoke.get('reference_ppl', math.nan)))} base + adapter."
    )
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
        *_load_section(inputs, merged, ref),
        "",
        *_serving_section(inputs, merged, ref),
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
    from ctxext.runfolder import find_reports, is_merged_folder, load_report, read_merged, read_run

    folder = Path(run_dir)
    smoke: dict[str, Any] = {}
    if is_merged_folder(folder):
        meta = read_merged(folder)
        run, smoke, merged = meta["run"], meta.get("smoke") or {}, True
    else:
        run = read_run(folder, allow_incomplete=allow_incomplete)
    if reports is None:
        loaded = find_reports(folder)
    else:
        loaded = [r if isinstance(r, Report) else load_report(r) for r in reports]
    return render_card(card_inputs(folder, run, loaded, smoke), merged=merged, repo_id=repo_id)
