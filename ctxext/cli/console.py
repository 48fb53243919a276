"""What users see when something goes wrong: the consoles, exit codes, and errors turned into messages.

A leaf module (typer and rich only), so every command module — ``ctxext.cli.commands``, ``ctxext.cli.evaluate``
and the workflows that print warnings — shares one console without importing the CLI.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)
# Written to a file or a pipe (a log; rich then assumes 80 columns), a message stays one line: a wrapped one breaks
# the numbers, paths and commands in it, and a grep for it. Tables keep their width; a terminal wraps as usual.
for _console in (console, err_console):
    _console.soft_wrap = not _console.is_terminal

P = ParamSpec("P")
R = TypeVar("R")

# Exit codes (docs/reliability.md): 2 for bad input (recipe, options, paths, a folder another command is writing,
# a full disk), 1 for a failure while working or a problem found (`inspect`), 128 + signal when stopped
# (130 Ctrl-C, 143 SIGTERM).
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler stopping the job) raises like Ctrl-C, so temporary folders and locks are cleaned up.

    Only where SIGTERM still has its default action and in the main thread (signal handlers live there);
    ``ctxext train`` sets its own handlers inside (it stops at a step boundary, with a checkpoint).
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        from ctxext.errors import Terminated

        raise Terminated(signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def plain(value: object) -> str:
    """``value`` as text that rich prints exactly: its ``[...]`` is not read as markup.

    Every dynamic part of a message printed with markup (a path, a model name, a list, another message) goes through
    this: rich reads ``runs/[exp]/x`` as a ``[exp]`` tag and prints ``runs//x``, and raises on a stray ``[/b]``.
    """
    from rich.markup import escape

    return escape(str(value))


def print_line(line: str) -> None:
    """A progress or log line from a workflow, printed as it is: no markup, no highlighting, unwrapped."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_error(exc: BaseException) -> None:
    # One unwrapped line per message line (paths and commands in it stay copyable), no markup parsing.
    err_console.print(f"[bold red]error:[/] {plain(exc)}", soft_wrap=True)


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn ctxext's user-facing errors into a red message and an exit code, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from ctxext.errors import CtxextError
        from ctxext.recipe.schema import RecipeError

        try:
            with _sigterm_as_interrupt():
                return fn(*args, **kwargs)
        except RecipeError as exc:
            err_console.print(f"[bold red]invalid recipe[/] {plain(exc.source)}: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{plain(key)}[/]: {plain(msg)}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except CtxextError as exc:  # every user-facing error of ctxext (ctxext.errors)
            _print_error(exc)
            raise typer.Exit(exc.exit_code) from None
        except (FileExistsError, FileNotFoundError) as exc:
            _print_error(exc)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt as exc:
            # Ctrl-C, or SIGTERM raised as ctxext.errors.Terminated: 128 + the signal (130, 143).
            code = getattr(exc, "exit_code", EXIT_INTERRUPTED)
            err_console.print(
                "[bold red]interrupted[/]" if code == EXIT_INTERRUPTED else f"[bold red]stopped by {plain(exc)}[/]"
            )
            raise typer.Exit(code) from None
        except Exception as exc:
            from ctxext.errors import is_disk_full

            if is_disk_full(exc):  # a write no writer wrapped: still one message, not a traceback
                _print_error(RuntimeError(f"the disk filled up ({exc}); free some space and run the command again"))
                raise typer.Exit(EXIT_BAD_INPUT) from None
            raise

    return wrapper
