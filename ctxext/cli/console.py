"""What users see when something goes wrong: the consoles, exit codes, and errors turned into messages.

A leaf module (typer and rich only), so every command module — ``ctxext.cli.commands``, ``ctxext.cli.evaluate``
and the workflows that print warnings — shares one console without importing the CLI.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)

P = ParamSpec("P")
R = TypeVar("R")

# Exit codes: 2 for bad input (recipe, options, paths), 1 for a failure while working.
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def _print_error(exc: BaseException) -> None:
    # One unwrapped line per message line (paths and commands in it stay copyable), no markup parsing.
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn ctxext's user-facing errors into a red message and an exit code, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from ctxext.errors import CtxextError
        from ctxext.recipe.schema import RecipeError

        try:
            return fn(*args, **kwargs)
        except RecipeError as exc:
            err_console.print(f"[bold red]invalid recipe[/] {exc.source}: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{key}[/]: {msg}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except CtxextError as exc:  # every user-facing error of ctxext (ctxext.errors)
            _print_error(exc)
            raise typer.Exit(exc.exit_code) from None
        except (FileExistsError, FileNotFoundError) as exc:
            _print_error(exc)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper
