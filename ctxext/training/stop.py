"""SIGTERM and Ctrl-C stop a training run cleanly: at a step boundary, with a checkpoint, resumable.

SIGTERM is what a scheduler (Slurm, Kubernetes, a preemptible cloud VM) sends before it kills a job;
it is handled like Ctrl-C. Once the run folder exists, the first signal asks the loop to stop after the
current optimizer step: the loop saves a checkpoint of that step, writes ``run.json`` as
``interrupted`` and ends with the resume command (exit code 128 + signal: 130 for Ctrl-C, 143 for
SIGTERM). A second signal stops at once (the checkpoint before is named instead). Before the run folder
exists (loading the model, the data) a signal stops at once: there is nothing to save yet.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ctxext.errors import Terminated

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Whether a stop signal arrived, and whether the run can stop at the next step boundary.

    Attributes:
        signum: the first stop signal received, or ``None``.
        graceful: whether the loop checks for a stop after each step (else a signal stops at once).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.graceful = False

    def handle(self, signum: int, frame: Any) -> None:
        """The signal handler: remember the first signal; raise :class:`Terminated` when that cannot wait."""
        if not self.graceful or self.signum is not None:
            raise Terminated(signum)
        self.signum = signum
        again = "press Ctrl-C again" if signum == signal.SIGINT else "send it again"
        print(
            f"\n{signal.Signals(signum).name}: stopping after this step with a checkpoint ({again} to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def pending(self, accelerator: Any) -> bool:
        """Whether any process of the job received a stop signal (all processes must stop at the same step)."""
        local = self.signum is not None
        if accelerator.num_processes == 1:
            return local
        import torch

        flags = accelerator.gather(torch.tensor([self.signum or 0], device=accelerator.device))
        received = [int(f) for f in flags.tolist() if int(f)]
        if received and self.signum is None:
            self.signum = received[0]
        return bool(received)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Turn SIGTERM and SIGINT into a :class:`StopRequest` (or :class:`Terminated`) for the block.

    Signal handlers can be set only in the main thread; elsewhere (a notebook's worker thread) the block runs
    with the handlers as they are.

    Yields:
        The run's :class:`StopRequest`.
    """
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop.handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
