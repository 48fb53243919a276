"""The one hierarchy of errors that the command line reports as a message, without a traceback.

Every user-facing error of ctxext is a :class:`CtxextError`; those about what the user gave (a recipe, a RoPE
setting, a model or file reference, an option) are :class:`InputError` (exit code 2). The ones that pydantic
validators may raise (RoPE, recipe, source errors) are also ``ValueError``, so pydantic reports them as
validation problems of the key that raised them.
"""

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
