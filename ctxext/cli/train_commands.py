"""``ctxext validate`` and ``ctxext train``: check a recipe, then fine-tune it (then calibrate, evaluate, push)."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxext.cli.console import EXIT_BAD_INPUT, console, err_console, friendly_errors, plain, print_line


@friendly_errors
def validate(
    args: Annotated[
        list[str] | None,
        typer.Argument(metavar="RECIPE... [KEY=VALUE...]", help="recipe YAML file(s), then key=value overrides"),
    ] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="key=value override (repeatable)")] = None,
    schema: Annotated[
        bool, typer.Option("--schema", help="list every recipe key with its type, default and meaning")
    ] = False,
) -> None:
    """Validate recipe files against the schema, the model, the RoPE plan and the eval suite (exit code 2 if any)."""
    from ctxext.cli.validate import check_recipe, distance_lines
    from ctxext.recipe.schema import RecipeError, load_recipe

    if schema:
        from ctxext.recipe.schema import schema_lines

        for line in schema_lines():
            console.print(line, markup=False, highlight=False)
        if not args:
            return
    # `ctxext validate r.yaml train.seq_len=2048` checks what `ctxext train r.yaml train.seq_len=2048` runs: an
    # argument with `=` that is not a file is an override (as --set).
    given = [a for a in args or [] if "=" in a and not Path(a).exists()]
    recipes = [Path(a) for a in args or [] if a not in given]
    given = [*(overrides or []), *given]
    if not recipes:
        err_console.print("[bold red]error:[/] give a recipe file (or --schema to list the keys)")
        raise typer.Exit(EXIT_BAD_INPUT)
    failed = False
    for path in recipes:
        try:
            recipe = load_recipe(path, given)
            warnings = check_recipe(recipe, str(path), check_output=True)
            notes = distance_lines(recipe, str(path))
        except RecipeError as exc:
            failed = True
            err_console.print(f"[bold red]✗ {plain(exc.source)}[/]: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{plain(key)}[/]: {plain(msg)}", soft_wrap=True)
            continue
        console.print(
            f"[green]✓[/] {plain(path)}: {plain(recipe.model.path)}, {recipe.rope.method} → "
            f"{recipe.rope.target_length}, seq_len {recipe.seq_len}, {recipe.train.max_steps} steps"
        )
        for note in [*recipe.window_lines, *notes]:
            console.print(f"  {note}", soft_wrap=True, markup=False, highlight=False)
        for warning in warnings:
            err_console.print(f"  [yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


@friendly_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file (see recipes/)")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. train.max_steps=10 output.dir=runs/x")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue the run in output.dir from its last checkpoint")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="refuse to start when `ctxext plan` predicts it will not fit")
    ] = False,
) -> None:
    """Fine-tune a RoPE-extended model with QLoRA on long documents (also under `accelerate launch -m ctxext train`)."""
    from ctxext.cli.validate import check_recipe
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.run import train as run_training

    parsed = load_recipe(recipe, overrides or [])
    # Before any model is loaded: problems that would surface only after training (an eval suite that
    # does not exist), what train refuses on this machine (validate's checks), and settings that run but teach
    # nothing (train.seq_len within the original window).
    for warning in check_recipe(parsed, str(recipe)):
        err_console.print(f"[yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    if os.environ.get("RANK", "0") == "0":  # what a multiple of the model's window came to, said once
        for line in parsed.window_lines:
            print_line(line)
    # A split this launch cannot make is refused before a weight is read (the launcher's WORLD_SIZE;
    # start_accelerator checks again against the processes accelerate sees).
    from ctxext.recipe.parallel import check_split_launch

    cfg = parsed.train
    check_split_launch(cfg.sequence_parallel_size, int(os.environ.get("WORLD_SIZE", "1")), cfg.context_parallel_size)
    parsed = _check_memory(parsed, strict, str(recipe), resume)
    searched = None
    if parsed.search is not None:
        # A search: section finds the longrope factors first (in output.dir/search); training starts from them.
        from ctxext.search.recipe import search_before_training

        searched = search_before_training(parsed, log=print_line)
        parsed = searched.recipe
        if resume and not (Path(parsed.output.dir) / "run.json").is_file():
            # Interrupted during its search: the run itself has not started, so there is nothing else to resume.
            err_console.print(f"note: {plain(parsed.output.dir)}: the search is done; the training starts now")
            resume = False
    result = run_training(
        parsed, resume=resume, command=list(sys.argv), search=searched.record if searched is not None else None
    )
    if result.model is not None:  # the main process: calibrate, evaluate, then publish, as the recipe asks
        _after_training(result.run_dir, parsed)


def _after_training(run_dir: Path, recipe: Any) -> None:
    """The run's calibration, the recipe's eval suite, then its Hub push: the CLI chains them, training does not.

    Calibrating first lets the suite (and the card) read the run as it will be loaded.
    """
    if recipe.calibrate.when != "never":
        calibrate_after_training(run_dir, recipe.calibrate)
    if recipe.eval.suite:
        from ctxext.evaluation.suite import run_suite_for_run

        run_suite_for_run(run_dir, recipe)
    if recipe.hub.push:
        from ctxext.publish.hub import push_run

        push_run(run_dir, recipe.hub)


def calibrate_after_training(run_dir: Path, section: Any) -> dict[str, Any] | None:
    """``ctxext calibrate RUN`` as the recipe's ``calibrate:`` asks, on the run's validation documents.

    With ``when: auto`` it runs only when its estimate is within ``max_share`` percent of the time the run's steps
    took, and a problem with the held-out text (too little of it) is a note: the training is done and kept either
    way, and the line names the command that calibrates later. ``when: always`` calibrates whatever it costs and
    fails on such a problem.

    Returns:
        The calibration record, or ``None`` when nothing was calibrated.
    """
    from ctxext.artifacts.run import training_seconds
    from ctxext.calibration.temperature import calibrate_run
    from ctxext.cli.calibrate_command import held_out_source
    from ctxext.errors import InputError
    from ctxext.progress import duration
    from ctxext.recipe.calibration import CalibrationSettings

    settings = CalibrationSettings.model_validate(section.model_dump(exclude={"when", "max_share"}))
    later = f"`ctxext calibrate {shlex.quote(str(run_dir))}` calibrates it"
    budget = None
    if section.when == "auto":
        seconds = training_seconds(run_dir) or 0.0
        share = f"{section.max_share:g} % of the {duration(seconds)} the training steps took"
        budget = (seconds * section.max_share / 100, f"{share} (calibrate.max_share; {later})")
    try:
        record = calibrate_run(run_dir, settings, held_out_source(run_dir, None), log=print_line, budget=budget)
    except InputError as exc:
        if section.when == "always":
            raise
        err_console.print(f"note: not calibrated: {plain(exc)} ({plain(later)} once that is fixed)", soft_wrap=True)
        return None
    if record is not None:
        console.print(
            f"[green]✓[/] {plain(run_dir)}/calibration.json: attention temperature "
            f"{record['attention_temperature']:g} ({record['seconds']:.0f} s)"
        )
    return record


def _problem(result: Any, command: str) -> str | None:
    """What a plan says when its run will not fit (``None`` when it fits), naming the overrides that would."""
    if result.fits:
        return None
    needed, have = result.memory.total / 2**30, result.device.memory / 2**30
    first = next((a for a in result.advice if a.fits), None)
    hint = f" Re-planned to fit: {first.summary} ({' '.join(first.overrides) or first.launch})." if first else ""
    device = result.device.name if "GiB" in result.device.name else f"{result.device.name} ({have:.1f} GiB)"
    return (
        f"the plan predicts {needed:.1f} GiB per process on {device}: this run will probably run out of memory."
        f"{hint} The breakdown: `{command} --cpu` (or --gpu NAME)."
    )


@dataclass
class MachineFit:
    """A recipe planned on this machine, with what it left to the machine decided.

    Attributes:
        recipe: the recipe to train (the settings it left to the machine set, :mod:`ctxext.planner.autofit`).
        line: that decision, in one line (``None``: nothing worth saying: the recipe left nothing to decide, or only
            a micro-batch that fits as given).
        as_given: nothing was lowered or turned on to fit.
        problem: what the plan says when the run will still not fit (``None``: it fits).
    """

    recipe: Any
    line: str | None = None
    as_given: bool = True
    problem: str | None = None


def fit_to_this_machine(recipe: Any, command: str, resume: bool = False) -> MachineFit:
    """Plan ``recipe`` on this machine: decide what it leaves to the machine, and say whether it will fit.

    ``--resume`` keeps the choice the run made when it started (its ``recipe.yaml``): its batches, and so its data
    order, do not depend on the memory of the machine it continues on.

    Raises:
        InputError: the run could not be planned (the caller decides whether that matters).
    """
    from ctxext.planner.autofit import left_to_machine, value_of, with_overrides
    from ctxext.planner.plan import plan_on_this_machine
    from ctxext.training.folder import RECIPE_FILE

    out = Path(recipe.output.dir)
    if resume and left_to_machine(recipe) and (out / RECIPE_FILE).is_file():
        chosen, kept = as_the_run_chose(recipe, out)
        changed = [f"{k} {str(v).lower()}" for k, v in kept.items() if value_of(recipe, k) != v]
        recipe = chosen
        line = f"settings left to the machine: {', '.join(changed)}, as the run chose when it started"
        problem = _problem(plan_on_this_machine(recipe, decide=False), command)
        return MachineFit(recipe, line if changed else None, not changed, problem)
    result = plan_on_this_machine(recipe)
    choice = result.choice
    if choice is None:
        return MachineFit(recipe, problem=_problem(result, command))
    # Said when something was given up, or what `auto` came to; a micro-batch that fits as given goes unsaid.
    said = not choice.as_given or recipe.train.gradient_checkpointing == "auto"
    fitted = with_overrides(recipe, choice.overrides)
    return MachineFit(fitted, choice.line if said else None, choice.as_given, _problem(result, command))


def as_the_run_chose(recipe: Any, folder: Path) -> tuple[Any, dict[str, Any]]:
    """``recipe`` with the choices the run in ``folder`` made (its ``recipe.yaml``) for what it leaves to the machine.

    Returns:
        The recipe with those choices set, and the choices (recipe key → value).
    """
    import yaml

    from ctxext.planner.autofit import saved_overrides, with_overrides
    from ctxext.training.folder import RECIPE_FILE

    kept = saved_overrides(recipe, yaml.safe_load((folder / RECIPE_FILE).read_text()) or {})
    return with_overrides(recipe, kept), kept


def _check_memory(recipe: Any, strict: bool, path: str = "RECIPE.yaml", resume: bool = False) -> Any:
    """Plan the recipe on this machine before training; returns the recipe to train.

    What the recipe leaves to the machine is decided (and said on one line); a run that will not fit is warned
    about (or, strict, refused).
    """
    from ctxext.errors import InputError

    main_process = os.environ.get("RANK", "0") == "0"
    try:
        fit = fit_to_this_machine(recipe, f"ctxext plan {shlex.quote(str(path))}", resume)
    except InputError as exc:
        if main_process:
            err_console.print(f"[yellow]warning:[/] could not plan the memory of this run: {plain(exc)}")
        return recipe
    if fit.line and main_process:
        print_line(fit.line)
    if fit.problem is None:
        return fit.recipe
    if strict:
        raise InputError(fit.problem + " (--strict: not started)")
    if main_process:
        err_console.print(f"[yellow]warning:[/] {plain(fit.problem)}")
    return fit.recipe
