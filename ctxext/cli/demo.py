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
   original window (``--plain``: source files only, the comparison), then calibrates its attention temperature
   when that costs little (the recipe's ``calibrate:``, as ``ctxext train`` does),
4. evaluates all four on held-out files with the same suite (``resources/demo-suite.yaml``): perplexity by
   length and position bucket, the context-use curve, and in-domain needle retrieval by depth
   (``KEY_xy = 68310`` hidden in code, retrieved after ``assert KEY_xy ==``),

then prints the comparison table and where the report and plots are. Every step is a public ctxext
API, the same a user calls; the demo only chains them. The fine-tune is an ordinary recipe file
(``recipes/default.yaml``: ``ctxext demo --print-recipe``), read by the recipe loader with the
command line's ``key=value`` overrides; a key of the suite (``needle.trials=10``) overrides the suite.
``--quick`` and ``--plain`` are sets of such overrides (:data:`QUICK`, :data:`PLAIN`). Results are cached
per step in the output folder, so a second run only re-prints (``--fresh`` recomputes); a cache made with
other settings is refused, never shown as if it were this run's.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table

from ctxext.cli.console import console as terminal
from ctxext.cli.console import err_console, friendly_errors, plain
from ctxext.errors import InputError
from ctxext.resources import RESOURCES

RECIPE = RESOURCES / "recipes" / "default.yaml"
SUITE = RESOURCES / "demo-suite.yaml"

# --quick (CI): every stage, far less work. The user's key=value overrides come after these, and win.
QUICK = (
    "train.max_steps=6",
    "train.probe.interval=3",
    "train.probe.trials=5",  # one key at each of the probe's five depths
    "train.micro_batch_size=2",
    "train.warmup_steps=1",
    "train.eval_every=5",
    "train.save_every=3",
    "data.max_documents=40",
    "needle.trials=2",
    "ruler.trials=2",
    "perplexity.max_docs=4",
    "perplexity.resamples=200",
)
# --plain: the comparison fine-tune, on the training-split files alone (no tasks, no short blocks).
PLAIN = ("data.mixture=null", "data.short_fraction=0", "data.path=builtin:stdlib")


@dataclass(frozen=True)
class DemoRun:
    """One demo run, resolved before anything is written: its recipe, its suite and where each goes.

    Attributes:
        recipe: the fine-tune's validated recipe (``output.dir`` is ``run_dir``).
        suite: the evaluation suite, overrides applied.
        out: the demo folder.
        plain: ``--plain``: the fine-tune and its report go to ``finetuned-plain`` and ``report-plain``.
        reference: the training-free reference row shown beside the fine-tune's own method.
        original: the base model's window.
        warnings: what ``ctxext validate`` would warn about the recipe.
        plan_command: the ``ctxext plan`` command of this recipe (for a fine-tune that will not fit).
    """

    recipe: Any
    suite: Any
    out: Path
    plain: bool
    reference: str
    original: int
    warnings: tuple[str, ...] = ()
    plan_command: str = "ctxext plan RECIPE.yaml"

    @property
    def target(self) -> int:
        """The extended length (``rope.target_length``)."""
        return int(self.recipe.rope.target_length)

    @property
    def factor(self) -> str:
        """``target / original`` as the row names show it (``4``)."""
        return f"{self.target / self.original:g}"

    @property
    def run_dir(self) -> Path:
        """The fine-tune's run folder."""
        return run_folder(self.out, self.plain)

    @property
    def report_dir(self) -> Path:
        """The evaluation report's folder."""
        return self.out / ("report-plain" if self.plain else "report")

    @property
    def kind(self) -> str:
        """What the fine-tune trained on, as its row names it: ``mix`` (a mixture) or ``plain``."""
        return "mix" if self.recipe.data.mixture else "plain"


def run_folder(out: Path, plain: bool) -> Path:
    """The fine-tune's run folder inside the demo folder ``out``."""
    return out / ("finetuned-plain" if plain else "finetuned")


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Route each ``key=value`` by its first key: recipe sections to the recipe, suite sections to the suite.

    Args:
        overrides: e.g. ``["train.max_steps=60", "needle.trials=10"]``.

    Returns:
        ``(recipe overrides, suite overrides)``, each in the given order.

    Raises:
        RecipeError: a key that is neither, or ``output.dir`` (the demo's folder is ``--out``).
    """
    from ctxext.evaluation.sections import SECTIONS
    from ctxext.evaluation.suite import Suite
    from ctxext.recipe.schema import Recipe, RecipeError

    recipe: list[str] = []
    suite: list[str] = []
    problems: list[tuple[str, str]] = []
    suite_keys = set(Suite.model_fields) | set(SECTIONS)
    for item in overrides:
        key = item.partition("=")[0].strip()
        head = key.split(".")[0]
        if key == "output.dir" or key == "output":
            problems.append((key, "the demo writes its fine-tune to <--out>/finetuned; choose the folder with --out"))
        elif head in Recipe.model_fields or "=" not in item:  # the recipe parser names a malformed override
            recipe.append(item)
        elif head in suite_keys:
            suite.append(item)
        else:
            problems.append(
                (
                    key,
                    f"neither a recipe key ({', '.join(Recipe.model_fields)}: `ctxext validate --schema`) nor a "
                    f"key of the demo's suite ({', '.join(sorted(suite_keys))})",
                )
            )
    if problems:
        raise RecipeError("command line", problems)
    return recipe, suite


def resolve_demo(
    out: Path,
    overrides: list[str] | None = None,
    recipe_file: Path = RECIPE,
    quick: bool = False,
    plain: bool = False,
    reference: str = "yarn",
) -> DemoRun:
    """Read and check everything the demo will run, before anything is written.

    Args:
        out: the demo folder.
        overrides: the user's ``key=value`` (after ``--quick`` and ``--plain``'s own, so they win).
        recipe_file: the fine-tune's recipe (the packaged one, or ``--recipe``).
        quick: apply :data:`QUICK`.
        plain: apply :data:`PLAIN`; the run goes to ``finetuned-plain``.
        reference: the training-free reference method.

    Returns:
        The resolved :class:`DemoRun`.

    Raises:
        InputError: a bad override, recipe, suite or method, each naming its key, file or flag.
    """
    from ctxext.cli.validate import check_recipe
    from ctxext.evaluation.suite import load_suite
    from ctxext.models.sources import load_config
    from ctxext.recipe.schema import RecipeError, load_recipe
    from ctxext.rope.methods import get_method
    from ctxext.rope.read import read_rope
    from ctxext.rope.types import RopeError

    try:
        get_method(reference)
    except RopeError as exc:
        raise InputError(f"--reference: {exc}") from None
    given = [*(QUICK if quick else ()), *(PLAIN if plain else ()), *(overrides or [])]
    recipe_overrides, suite_overrides = split_overrides(given)
    recipe = load_recipe(recipe_file, recipe_overrides)
    if recipe.rope.target_length is None:
        raise RecipeError(str(recipe_file), [("rope.method", "the demo extends the model: choose a method, not none")])
    folder = str(run_folder(out, plain))
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update={"dir": folder})})
    warnings = tuple(check_recipe(recipe, str(recipe_file)))
    suite, _ = load_suite(SUITE, suite_overrides)
    config, _ = load_config(recipe.model.path, recipe.model.revision)
    original = read_rope(config, original_length=recipe.model.original_length).original_length
    plan_command = shlex.join(["ctxext", "plan", str(recipe_file), *recipe_overrides])
    return DemoRun(recipe, suite, out, plain, reference, original, warnings, plan_command)


def print_recipe(recipe_file: Path = RECIPE) -> None:
    """Write the recipe file the demo reads, comments included, to stdout (``ctxext demo --print-recipe``)."""
    if not recipe_file.is_file():
        raise InputError(f"--recipe: {recipe_file} does not exist")
    sys.stdout.write(recipe_file.read_text())


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


def run_demo(run: DemoRun, fresh: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Run the demo and return the evaluation report.

    Args:
        run: what to run (:func:`resolve_demo`).
        fresh: recompute every step instead of reusing the demo folder.
        console: where to print (default: a new rich console).

    Returns:
        The report dict (also in ``<out>/report/report.json``).
    """
    console = console or Console()
    for warning in run.warnings:
        err_console.print(f"[yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    cached = None
    if not fresh:  # a cache of another recipe or suite is refused before anything is written
        cached = _cached_run(run)
        _cached_report(run)
    run = cached or _fit_to_this_machine(run, console)
    prepare_demo_folder(run.out, fresh)
    started = time.time()
    model, method = run.recipe.model.path, run.recipe.rope.method
    console.rule(f"[bold]ctxext demo[/]: {plain(model)}, {run.original} → {run.target} tokens with {method}")
    methods = _extend(run, console)
    _finetune(run, console)
    report = _evaluate(run, methods, console)
    console.print(comparison_table(report, run.original, run.target))
    from ctxext.evaluation.target import reading_lines, report_readings

    # The fine-tune's row of report.md's relative-target section (the base is the report's reference).
    for reading in (r for r in report_readings(report) if r.model == tuned_name(run)):
        for line in reading_lines(reading):
            console.print(line, markup=False, highlight=False)
    report_file = run.report_dir / "report.json"
    console.print(f"report: {run.report_dir / 'report.md'}  (JSON: {report_file})", markup=False, highlight=False)
    for png in sorted(run.report_dir.glob("*.png")):
        console.print(f"plot:   {png}", markup=False, highlight=False)
    console.print(f"[dim]{time.time() - started:.0f} s[/]")
    return report


def tuned_name(run: DemoRun) -> str:
    """The fine-tuned model's name in the demo's report."""
    return f"{run.recipe.rope.method}×{run.factor}+QLoRA {run.kind}"


def _fit_to_this_machine(run: DemoRun, console: Console) -> DemoRun:
    """The run with what its recipe leaves to the machine decided, or refused when it will not fit even so.

    Refused before anything is written, when the memory plan says this machine cannot hold the fine-tune.

    With ``model.path`` any base runs the default recipe at 4× its window: a large one needs recomputation and a
    smaller micro-batch (decided here, said on one line) or memory levers (or a GPU) that the demo's small base does
    not. ``ctxext train`` warns and starts; the demo refuses, since a demo that swaps for hours is worse than one
    line naming the overrides that fit.
    """
    from ctxext.cli.train_commands import fit_to_this_machine

    try:
        fit = fit_to_this_machine(run.recipe, run.plan_command)
    except InputError:
        return run  # a run that cannot be planned is not refused on a guess (ctxext train warns the same way)
    if fit.line and not fit.as_given:  # the demo's own base fits as given: nothing to say then
        console.print(fit.line, markup=False, highlight=False, soft_wrap=True)
    if fit.problem:
        raise InputError(
            f"the demo's fine-tune: {fit.problem} Add the overrides to `ctxext demo` (nothing was written)."
        )
    return dataclasses.replace(run, recipe=fit.recipe)


def _extend(run: DemoRun, console: Console) -> list[str]:
    """1-2. Training-free extension: plain model folders that vanilla transformers loads; returns the methods."""
    from ctxext.models.folder import extend_folder

    rope, model = run.recipe.rope, run.recipe.model
    methods = list(dict.fromkeys([run.reference, rope.method]))
    for method in methods:
        patched = run.out / f"patched-{method}"
        if (patched / "config.json").is_file():
            console.print(f"[cyan]1/3[/] extended model cached: {plain(patched)}")
            continue
        console.print(f"[cyan]1/3[/] extending {plain(model.path)} ×{run.factor} with {method} → {plain(patched)}")
        # The fine-tune's own method as the recipe sets it, so that its row is the fine-tune's starting point.
        options = rope.options() if method == rope.method else None
        extend_folder(model.path, patched, method, run.target, options, model.original_length, overwrite=True)
    return methods


def _finetune(run: DemoRun, console: Console) -> None:
    """3. nf4 QLoRA fine-tune of the extended model (cached: a run of another recipe is refused, not reused)."""
    from ctxext.training.run import train as run_training

    if _cached_run(run):
        console.print(f"[cyan]2/3[/] fine-tuned run cached: {plain(run.run_dir)}")
        return
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)
    what = "plain code" if run.kind == "plain" else "code + retrieval tasks + short blocks"
    steps = run.recipe.train.max_steps
    # With the adaptive stop the ceiling is rarely what runs: the demo's base reaches the probe's goal at step 80.
    length = f"until its probe's goal, at most {steps} steps" if run.recipe.train.probe else f"{steps} steps"
    console.print(f"[cyan]2/3[/] fine-tuning with nf4 QLoRA on {what}: {length}")
    run_training(run.recipe, command=["ctxext", "demo"])
    if run.recipe.calibrate.when != "never":  # as `ctxext train` does with the recipe's calibrate: section
        from ctxext.cli.train_commands import calibrate_after_training

        calibrate_after_training(run.run_dir, run.recipe.calibrate)


def _cached_run(run: DemoRun) -> DemoRun | None:
    """The run as the demo folder's complete fine-tune of this recipe made it (``None``: no such fine-tune).

    What the recipe leaves to the machine is taken as that fine-tune chose it.

    Raises:
        InputError: it holds a complete fine-tune of another recipe (reusing it would show the wrong row).
    """
    from ctxext.cli.train_commands import as_the_run_chose
    from ctxext.recipe.schema import dump_recipe
    from ctxext.training.folder import RECIPE_FILE, recipe_diffs
    from ctxext.training.run import read_run

    try:
        read_run(run.run_dir)
    except InputError:
        return None
    cached = dataclasses.replace(run, recipe=as_the_run_chose(run.recipe, run.run_dir)[0])
    diffs = recipe_diffs((run.run_dir / RECIPE_FILE).read_text(), dump_recipe(cached.recipe))
    if diffs:
        raise InputError(
            f"--out: the fine-tune cached in {run.run_dir} was trained with another recipe ({'; '.join(diffs)}); "
            "add --fresh to recompute the demo, or choose another --out"
        )
    return cached


def _cached_report(run: DemoRun) -> dict[str, Any] | None:
    """The report in the demo folder when it holds one, made with this suite.

    Raises:
        InputError: the cached report was made with other suite settings (it would show other numbers).
    """
    from ctxext.artifacts.report import read_report

    report_file = run.report_dir / "report.json"
    if not report_file.is_file():
        return None
    report = read_report(report_file).to_json_dict()  # through the schema: an old layout is refused
    cached = report.get("suite", {}).get("definition") or {}
    wanted = json.loads(json.dumps(run.suite.model_dump(), default=str))
    changed = sorted(k for k in set(cached) | set(wanted) if cached.get(k) != wanted.get(k))
    if changed:
        raise InputError(
            f"--out: the report cached in {run.report_dir} was made with other suite settings ({', '.join(changed)}); "
            "add --fresh to recompute the demo, or choose another --out"
        )
    return report


def _evaluate(run: DemoRun, methods: list[str], console: Console) -> dict[str, Any]:
    """4. One suite, every model, the same held-out data (cached in the report folder)."""
    from ctxext.evaluation.suite import run_suite
    from ctxext.models.load import ModelSpec

    cached = _cached_report(run)
    if cached is not None:
        console.print(f"[cyan]3/3[/] report cached: {plain(run.report_dir / 'report.json')}")
        return cached
    console.print("[cyan]3/3[/] evaluating base (unpatched, past its window), training-free, fine-tuned")
    specs = [
        ModelSpec(run.recipe.model.path, name="base"),
        *(ModelSpec(str(run.out / f"patched-{m}"), name=f"{m}×{run.factor}") for m in methods),
        ModelSpec(str(run.run_dir), name=tuned_name(run)),
    ]
    return run_suite(
        run.suite,
        specs,
        run.report_dir,
        suite_path=str(SUITE),
        allow_beyond_for={0},
        command="ctxext demo",
        overwrite=True,
    )


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
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="key=value overrides of the demo's recipe (train.max_steps=60, rope.method=yarn, model.path=…) "
            "or of its eval suite (needle.trials=10)",
            show_default=False,
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="output folder (reused as a cache by later runs)")] = Path("runs/demo"),
    recipe: Annotated[
        Path | None,
        typer.Option(help="fine-tune with this recipe file instead of the demo's (start from --print-recipe)"),
    ] = None,
    reference: Annotated[
        str, typer.Option(help="training-free reference row shown beside rope.method's (the recipe's method)")
    ] = "yarn",
    quick: Annotated[
        bool, typer.Option("--quick", help="a reduced setting (CI): every stage, little work (6 QLoRA steps)")
    ] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="recompute every step instead of reusing --out")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", help="fine-tune on plain code only, not the retrieval mixture (comparison)")
    ] = False,
    print_recipe_file: Annotated[
        bool,
        typer.Option("--print-recipe", help="print the demo's recipe file (to copy: > my.yaml) and exit"),
    ] = False,
    removed_model: Annotated[str | None, typer.Option("--model", hidden=True)] = None,
) -> None:
    """Grown model → evaluate unpatched at 4× → extend (YaRN, llama3) → nf4 QLoRA → evaluate all, compared."""
    from ctxext.artifacts.lock import folder_lock

    if removed_model is not None:  # a removed flag answers with its replacement, not "No such option"
        raise InputError(
            f"--model was removed: the model is a recipe key now; use model.path={shlex.quote(removed_model)} "
            "(e.g. `ctxext demo model.path=builtin:grown-code-64`)"
        )

    recipe_file = recipe if recipe is not None else RECIPE
    if print_recipe_file:
        if overrides or quick or plain:
            raise InputError(
                "--print-recipe prints the recipe file as it is; drop the overrides, --quick and --plain (give "
                "them to `ctxext demo` or `ctxext train FILE` after copying it)"
            )
        print_recipe(recipe_file)
        return
    # Everything is read and checked before the folder is touched: bad input writes nothing.
    run = resolve_demo(out, overrides, recipe_file, quick=quick, plain=plain, reference=reference)
    with folder_lock(out):  # one demo per folder: --fresh deletes what a running demo is writing
        run_demo(run, fresh, terminal)
