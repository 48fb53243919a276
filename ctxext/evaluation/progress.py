"""Progress bars with ETA (rich), shared by the evaluators; silent when asked or not attached to a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Advance(Protocol):
    """Advance a progress bar by some units of work."""

    def __call__(self, amount: float = 1) -> None: ...  # noqa: D102


@contextmanager
def progress_bar(description: str, total: float, enabled: bool = True) -> Iterator[Advance]:
    """A rich progress bar with elapsed time and ETA.

    Args:
        description: what is being done.
        total: units of work (e.g. tokens to score).
        enabled: show the bar (it is drawn on stderr, and only on a terminal).

    Yields:
        A function that advances the bar.
    """
    if not enabled:
        yield lambda amount=1: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda amount=1: None
        return
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda amount=1: progress.advance(task, amount)
