"""The one hierarchy of errors that the command line reports as a message, without a traceback.

Every user-facing error of ctxext is a :class:`CtxextError`; those about what the user gave (a recipe, a RoPE
setting, a model or file reference, an option) are :class:`InputError` (exit code 2). The ones that pydantic
validators may raise (RoPE, recipe, source errors) are also ``ValueError``, so pydantic reports them as
validation problems of the key that raised them.

A full disk is recognised here too (:func:`is_disk_full`, :func:`disk_full_message`), for every writer: output
folders, lock files, checkpoints, the search log and the command line's last resort.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


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


# errno values meaning "no room left": the disk is full, or the user's quota is used up.
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# How libraries that wrap the OS error (safetensors' Rust writer, torch's zip writer) spell the same thing.
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull", "os error 28")


# Less free space than this where a write just failed: the disk is full, whatever the error says.
_NEARLY_FULL = 1 << 20


def is_disk_full(exc: BaseException, where: str | Path | None = None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the disk or the quota is full.

    Args:
        exc: the exception a write raised.
        where: the folder written to. Some writers lose the errno (torch's checkpoint writer raises
            ``RuntimeError: basic_ios::clear: iostream error`` on a full disk): a failed write to a file
            system with under 1 MiB free counts as a full disk.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return True
        if any(text in str(seen) for text in _DISK_FULL_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    if where is None:
        return False
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return False
    return usage.free < _NEARLY_FULL


def disk_full_message(flag: str, out: str | Path, exc: BaseException) -> str:
    """The one message for a write that ran out of space (nothing of the partial output is left)."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "no space left on device"
    return (
        f"{flag} {out}: the disk filled up while writing ({reason}); the partial output was removed and any "
        f"previous {out} is untouched. Free some space (or choose another {flag} on a larger disk) and run the "
        "command again."
    )
