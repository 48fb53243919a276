"""The base of errors that the command line reports as a message, without a traceback."""

from __future__ import annotations


class CtxextError(RuntimeError):
    """A failure a user can act on; the message says what is wrong and what to do.

    Attributes:
        exit_code: the process exit status the CLI uses (2: bad input, 1: failed while working).
    """

    exit_code: int = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(CtxextError):
    """Bad input: a data file, option or folder that cannot be used as given."""

    exit_code = 2


class Terminated(KeyboardInterrupt):
    """A stop signal (SIGTERM from a scheduler, SIGINT from Ctrl-C) raised as an exception, so cleanup runs.

    A ``KeyboardInterrupt``, so whatever handles Ctrl-C handles SIGTERM the same way.

    Attributes:
        signum: the signal.
        exit_code: the shell's convention for death by that signal, 128 + signum (130 Ctrl-C, 143 SIGTERM).
    """

    def __init__(self, signum: int):
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum
