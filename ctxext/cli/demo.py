"""``ctxext demo``: the whole journey on a real model grown here, in minutes on a CPU.

The built-in ``grown-code-64-mk`` is a small Llama pretrained on the Python standard library's source at
a 64-token window (``benchmarks/grow_base.py``), with the in-window skills a real base has and the demo
measures at 4×: it retrieves a key/value needle, and picks the asked key among several by its name
(``grown-code-64``, the stage before, does not). The demo

1. evaluates it unpatched at 4× its window (the failure context extension exists to fix),
2. extends it 4× training-free (``ctxext extend``) with YaRN (the usual reference) and with Llama 3.1's
   RoPE scaling (``llama3``, the method the fine-tune uses: it keeps the high frequencies, so the model
   stays closer to itself inside its window),
3. fine-tunes the ``llama3``-extended model with nf4 QLoRA (``ctxext train``) on a training mixture: training-split
   source files, synthetic key/value retrieval tasks on them (``ctxext.tasks``) and short blocks at the
   original window (``--plain``: source files only, the comparison),
4. evaluates all four on held-out files with the same suite (``eval/demo.yaml``): perplexity by
   length and position bucket, the context-use curve, and in-domain needle retrieval by depth
   (``KEY_xy = 68310`` hidden in code, retrieved after ``assert KEY_xy ==``),

then prints the comparison table and where the report and plots are. Every step is a public ctxext
API, the same a user calls; the demo only chains them. Results are cached per step in the output
folder, so a second run only re-prints (``--fresh`` recomputes).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table

from ctxext.cli.console import console as terminal
from ctxext.cli.console import friendly_errors, plain
from ctxext.errors import InputError
from ctxext.resources import RESOURCES

SUITE = RESOURCES / "demo-suite.yaml"


@dataclass
class DemoSettings:
    """What the demo runs.

    Attributes:
        model: the base model (default: the grown model).
        method: the extension method of the fine-tune (and its training-free row).
        reference_method: a second training-free row (the usual reference), when it differs from ``method``.
        factor: target length / original length.
        out: the output folder.
        train_steps: QLoRA optimizer steps.
        micro_batch_size: sequences per step.
        learning_rate: LoRA learning rate.
        max_documents: training documents (standard-library train split).
        trials: needle trials per (length, depth) cell.
        max_docs: held-out documents for perplexity.
        fresh: recompute every step.
        plain: fine-tune on plain code only (the mixture's baseline) instead of the mixture.
        short_fraction: mixture: share of rows made of blocks at the original length.
        task_weight: mixture: share of rows of synthetic key/value retrieval tasks.
        multikey_share: mixture: the part of ``task_weight`` given to ``multikey`` rows (2 distractor
            keys) instead of single-key ``needle`` rows. 0 by default: on the demo's model they change
            neither multi-key nor single-key retrieval at 4× measurably (one seed, answer-only rows), and on
            ``grown-code-64``, which cannot select a key by name, they cost single-key retrieval.
        pose: mixture: train with PoSE at ``pose_seq_factor`` × the window instead of the full target.
        pose_seq_factor: PoSE row length in windows.
        lora_r: LoRA rank.
        gradient_checkpointing: recompute activations in the backward pass (saves memory, costs time;
            the grown model needs no saving, so the demo trains without it).
    """

    model: str = "builtin:grown-code-64-mk"
    method: str = "llama3"
    reference_method: str = "yarn"
    factor: int = 4
    out: Path = Path("runs/demo")
    train_steps: int = 240
    micro_batch_size: int = 8
    learning_rate: float = 1e-3
    max_documents: int = 400
    trials: int = 50
    max_docs: int = 24
    fresh: bool = False
    plain: bool = False
    short_fraction: float = 0.2
    task_weight: float = 0.5
    multikey_share: float = 0.0
    pose: bool = False
    pose_seq_factor: int = 2
    lora_r: int = 16
    gradient_checkpointing: bool = False

    @classmethod
    def quick(cls, out: Path) -> DemoSettings:
        """A reduced setting for CI: every stage of the demo, far less work (6 QLoRA steps)."""
        return cls(out=out, train_steps=6, micro_batch_size=2, max_documents=40, trials=2, max_docs=4)


def training_mixture(settings: DemoSettings, original: int) -> list[dict[str, Any]]:
    """The demo's training mixture: training-split stdlib code and key/value retrieval tasks on it.

    The tasks use the registry's training templates (template 4, ``{name}_id = {key}``, is held out
    for evaluation); samples are at least the original window long and their needle-to-question
    distances are uniform over the whole target (``data.task_distance``, docs/training.md). ``multikey``
    rows are off by default (see :class:`DemoSettings`); a model that retrieves one of several keys
    inside its window should keep a share of them, so that the fine-tune carries that skill to the new
    length too.
    """
    tasks, multikey = settings.task_weight, settings.task_weight * settings.multikey_share
    # Templates 0-2 (code and comment forms) fit a 64-token window; the prose template 3 needs more.
    mixture: list[dict[str, Any]] = [
        {"path": "builtin:stdlib", "weight": 1.0 - tasks},
        {"task": "needle", "weight": tasks - multikey, "min_length": original, "templates": [0, 1, 2]},
    ]
    if multikey > 0:
        mixture.append(
            {
                "task": "multikey",
                "weight": multikey,
                "distractors": 2,
                "min_length": 2 * original,
                "templates": [0, 1, 2],
            }
        )
    return mixture


def finetune_recipe(settings: DemoSettings, original: int, target: int, run_dir: Path) -> Any:
    """The demo's fine-tuning recipe (the mixture by default; plain code with ``settings.plain``).

    Args:
        settings: what to run.
        original: the base model's window.
        target: the extended length.
        run_dir: the run's output folder.

    Returns:
        The validated :class:`ctxext.recipe.schema.Recipe`.
    """
    from ctxext.recipe.schema import parse_recipe

    # builtin:stdlib trains on the standard library's train split; the evaluation reads held-out files.
    data: dict[str, Any] = {
        "path": "builtin:stdlib",
        "max_documents": settings.max_documents,
        "validation_fraction": 0.05,
    }
    seq_len = target
    train_extra: dict[str, Any] = {}
    if not settings.plain:
        data = {
            "mixture": training_mixture(settings, original),
            "short_fraction": settings.short_fraction,
            "max_documents": settings.max_documents,
            "validation_fraction": 0.05,
        }
        if settings.pose:
            seq_len = min(target, settings.pose_seq_factor * original)
            train_extra["pose"] = {"chunks": 2}
    return parse_recipe(
        {
            "model": {"path": settings.model},
            "rope": {"method": settings.method, "target_length": target},
            "quantization": {"mode": "nf4", "double_quant": True},
            "lora": {"r": settings.lora_r, "alpha": 2 * settings.lora_r, "extra_trainable": ["embed_tokens", "norm"]},
            "data": data,
            "train": {
                "seq_len": seq_len,
                "micro_batch_size": settings.micro_batch_size,
                "max_steps": settings.train_steps,
                "learning_rate": settings.learning_rate,
                "warmup_steps": max(1, settings.train_steps // 20),
                "scheduler": "cosine",
                "eval_every": max(5, settings.train_steps // 4),
                "save_every": max(1, settings.train_steps // 2),
                "loss_chunk_size": 256,
                "seed": 0,
                "gradient_checkpointing": settings.gradient_checkpointing,
                **train_extra,
            },
            "output": {"dir": str(run_dir)},
        },
        source="ctxext demo",
    )


def _suite(settings: DemoSettings) -> Any:
    from ctxext.evaluation.suite import load_suite

    overrides = [
        f"needle.trials={settings.trials}",
        f"ruler.trials={settings.trials}",
        f"perplexity.max_docs={settings.max_docs}",
    ]
    if settings.trials < 5:
        overrides.append("perplexity.resamples=200")
    suite, _ = load_suite(SUITE, overrides)
    return suite


# What the demo writes inside its folder; --fresh deletes these and nothing else.
_DEMO_ITEMS = ("patched-*", "finetuned", "report")


def prepare_demo_folder(out: Path, fresh: bool) -> Path:
    """Create (or reuse) the demo's folder; refuse a folder the demo did not create.

    The folder is a cache: a later run reuses what an earlier one computed. It is marked as a demo
    folder when created, so that an existing folder of the user's is never written into or, with
    ``--fresh``, emptied.

    Args:
        out: the demo folder.
        fresh: delete the demo's earlier results (only those) first.

    Returns:
        ``out``.

    Raises:
        InputError: ``out`` is a file, or a non-empty folder the demo did not create.
    """
    from ctxext.atomic import OUTPUT_MARKER, check_output, read_manifest

    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None or manifest.get("kind") != "demo":
        check_output(out, "demo", overwrite=False)
    elif fresh:
        for pattern in _DEMO_ITEMS:
            for item in out.glob(pattern):
                shutil.rmtree(item) if item.is_dir() else item.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / OUTPUT_MARKER).write_text(json.dumps({"kind": "demo", "files": []}) + "\n")
    return out


def run_demo(settings: DemoSettings, console: Console | None = None) -> dict[str, Any]:
    """Run the demo and return the evaluation report.

    Args:
        settings: what to run.
        console: where to print (default: a new rich console).

    Returns:
        The report dict (also in ``<out>/report/report.json``).
    """
    from ctxext.artifacts.report import read_report
    from ctxext.evaluation.loading import ModelSpec
    from ctxext.evaluation.suite import run_suite
    from ctxext.extend.folder import extend_folder
    from ctxext.models.sources import load_config
    from ctxext.rope.read import read_rope
    from ctxext.training.run import read_run
    from ctxext.training.run import train as run_training

    console = console or Console()
    out = prepare_demo_folder(Path(settings.out), settings.fresh)
    started = time.time()

    config, _ = load_config(settings.model)
    original = read_rope(config).original_length
    target = original * settings.factor
    console.rule(f"[bold]ctxext demo[/]: {plain(settings.model)}, {original} → {target} tokens with {settings.method}")

    # 1-2. Training-free extension: plain model folders that vanilla transformers loads.
    methods = list(dict.fromkeys([settings.reference_method, settings.method]))
    for method in methods:
        patched = out / f"patched-{method}"
        if not (patched / "config.json").is_file():
            console.print(
                f"[cyan]1/3[/] extending {plain(settings.model)} ×{settings.factor} with {method} → {plain(patched)}"
            )
            extend_folder(settings.model, patched, method, target, overwrite=True)
        else:
            console.print(f"[cyan]1/3[/] extended model cached: {plain(patched)}")

    # 3. nf4 QLoRA fine-tune of the extended model: the retrieval mixture, or plain code (--plain).
    kind = "plain" if settings.plain else "mix"
    run_dir = out / ("finetuned-plain" if settings.plain else "finetuned")
    try:
        read_run(run_dir)
        console.print(f"[cyan]2/3[/] fine-tuned run cached: {plain(run_dir)}")
    except InputError:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        what = "plain code" if settings.plain else "code + retrieval tasks + short blocks"
        console.print(f"[cyan]2/3[/] fine-tuning with nf4 QLoRA on {what}: {settings.train_steps} steps")
        run_training(finetune_recipe(settings, original, target, run_dir), command=["ctxext", "demo"])

    # 4. One suite, three models, the same held-out data.
    report_dir = out / ("report-plain" if settings.plain else "report")
    report_file = report_dir / "report.json"
    if report_file.is_file():
        console.print(f"[cyan]3/3[/] report cached: {plain(report_file)}")
        report = read_report(report_file).to_json_dict()  # through the schema: an old layout is refused
    else:
        console.print("[cyan]3/3[/] evaluating base (unpatched, past its window), training-free, fine-tuned")
        specs = [
            ModelSpec(settings.model, name="base"),
            *(ModelSpec(str(out / f"patched-{m}"), name=f"{m}×{settings.factor}") for m in methods),
            ModelSpec(str(run_dir), name=f"{settings.method}×{settings.factor}+QLoRA {kind}"),
        ]
        report = run_suite(
            _suite(settings),
            specs,
            report_dir,
            suite_path=str(SUITE),
            allow_beyond_for={0},
            command="ctxext demo",
            overwrite=True,
        )
    console.print(comparison_table(report, original, target))
    console.print(f"report: {report_dir / 'report.md'}  (JSON: {report_file})", markup=False, highlight=False)
    for png in sorted(report_dir.glob("*.png")):
        console.print(f"plot:   {png}", markup=False, highlight=False)
    console.print(f"[dim]{time.time() - started:.0f} s[/]")
    return report


def _ppl(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    mark = " †" if entry.get("beyond_context") else ""
    return f"{entry['ppl']:.1f}{mark}\n[dim]{entry['ci_low']:.1f}–{entry['ci_high']:.1f}[/]"


def _acc(grid: dict[str, Any] | None, length: int) -> str:
    if not grid:
        return "-"
    cell = grid.get("by_length", {}).get(str(length))
    if not cell:
        return "-"
    return f"{100 * cell['accuracy']:.0f}%\n[dim]{100 * cell['ci_low']:.0f}–{100 * cell['ci_high']:.0f}%[/]"


def comparison_table(report: dict[str, Any], original: int, target: int) -> Group:
    """The demo's summary: a perplexity table and a retrieval table, one row per model each.

    Args:
        report: an evaluation report (``ctxext.eval.report/v1``).
        original: the base model's window.
        target: the extended length.

    Returns:
        A rich renderable (two tables, each narrow enough for an 80-column terminal).
    """
    ppl_table = Table(
        title=f"window {original} → {target} tokens, held-out stdlib files: perplexity",
        caption="base = unpatched (†: past its window); second lines: 95% CIs",
    )
    for col in ("model", f"ppl@{original}", f"ppl@{target}", f"ppl pos≥{target - target // 8}"):
        ppl_table.add_column(col, no_wrap=True)
    ret_table = Table(
        title="key retrieval (teacher-forced)",
        caption="needle: KEY_xy = 12345 hidden in code, asked after `assert KEY_xy ==`; 2 keys: two other keys "
        "hidden too; new form: xy_id = 12345, never trained on. Second lines: 95% CIs",
    )
    for col in ("model", f"needle@{original}", f"needle@{target}", f"2 keys@{target}", f"new form@{target}"):
        ret_table.add_column(col, no_wrap=True)
    for model in report.get("models", []):
        ppl = model.get("perplexity") or {}
        by_length = ppl.get("by_length", {})
        buckets = ppl.get("by_bucket") or []
        ruler = (model.get("ruler") or {}).get("tasks", {})
        name = model.get("name", "?")
        ppl_table.add_row(
            name,
            _ppl(by_length.get(str(original))),
            _ppl(by_length.get(str(target))),
            _ppl(buckets[-1]) if buckets else "-",
        )
        ret_table.add_row(
            name,
            _acc(model.get("needle"), original),
            _acc(model.get("needle"), target),
            _acc(ruler.get("multikey-2"), target),
            _acc(ruler.get("needle-heldout-form"), target),
        )
    return Group(ppl_table, ret_table)


@friendly_errors
def demo(
    out: Annotated[Path, typer.Option(help="output folder (reused as a cache by later runs)")] = Path("runs/demo"),
    model: Annotated[str, typer.Option(help="base model")] = "builtin:grown-code-64-mk",
    method: Annotated[
        str | None, typer.Option(help="extension method of the fine-tune (default llama3; YaRN is always shown too)")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="QLoRA steps (default 240; 6 with --quick)")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="a reduced setting (CI): every stage, little work (6 QLoRA steps)")
    ] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="recompute every step instead of reusing --out")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", help="fine-tune on plain code only, not the retrieval mixture (comparison)")
    ] = False,
) -> None:
    """Grown model → evaluate unpatched at 4× → extend (YaRN, llama3) → nf4 QLoRA → evaluate all, compared."""
    from ctxext.artifacts.lock import folder_lock

    settings = DemoSettings.quick(out) if quick else DemoSettings(out=out)
    settings.model, settings.fresh, settings.plain = model, fresh, plain
    if method is not None:
        settings.method = method
    if steps is not None:
        settings.train_steps = steps
    with folder_lock(out):  # one demo per folder: --fresh deletes what a running demo is writing
        run_demo(settings, terminal)
