"""The ``ctxext`` command line (typer): the one ``app``, its root options, and where each command lives.

Each command group is a module of its own (``rope_commands``, ``train_commands``, ``plan_command``,
``search_command``, ``evaluate``, ``calibrate_command``, ``tasks``, ``publish_commands``, ``demo``); this
module registers them in the order ``ctxext --help`` lists them. Heavy modules are imported inside commands,
so help is fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ctxext.cli import (
    calibrate_command,
    demo,
    plan_command,
    publish_commands,
    rope_commands,
    search_command,
    train_commands,
)
from ctxext.cli.evaluate import eval_app
from ctxext.cli.tasks import tasks_app
from ctxext.recipe.flags import MethodOptionsCommand, settings_command

app = typer.Typer(
    name="ctxext",
    help="Extend the context window of Hugging Face causal LMs: patch RoPE, fine-tune with QLoRA, evaluate, publish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", help="show third-party warnings and progress bars that ctxext hides")
    ] = False,
) -> None:
    """Extend the context window of Hugging Face causal LMs: patch RoPE, fine-tune with QLoRA, evaluate, publish."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party(verbose)


# The order here is the order of `ctxext --help`.
app.command("inspect")(rope_commands.inspect)
# The method options (--beta-fast, --rope-theta …) are generated from the method declarations.
app.command("extend", cls=MethodOptionsCommand)(rope_commands.extend)
app.command("validate")(train_commands.validate)
app.command("methods")(rope_commands.methods)
app.command("train")(train_commands.train)
app.command("plan")(plan_command.plan)
# The search settings (--objective, --samples …) are generated from their declaration (ctxext/recipe/search.py).
app.command(
    "search", cls=settings_command("ctxext.recipe.search:SearchOptions", panel="Search settings (a recipe's search:)")
)(search_command.search)
app.add_typer(eval_app, name="eval")
# The calibration settings (--temperatures, --trials …) are generated from their declaration.
app.command(
    "calibrate",
    cls=settings_command(
        "ctxext.recipe.calibration:CalibrationSettings", panel="Calibration settings (what is measured)"
    ),
)(calibrate_command.calibrate)
app.add_typer(tasks_app, name="tasks")
app.command("export")(publish_commands.export_cmd)
app.command("merge")(publish_commands.merge)
app.command("push")(publish_commands.push)
app.command("demo")(demo.demo)


def main() -> None:
    """Entry point of the ``ctxext`` console script."""
    app()


if __name__ == "__main__":
    main()
