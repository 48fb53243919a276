"""One writer per output folder: a lock file beside the folder, created with ``O_CREAT | O_EXCL``.

Every command that writes a folder holds :func:`folder_lock` on it from its first check to its last
write, so a second writer into the same folder is refused before it does any work, with the holder
named. The lock is the file ``.NAME.ctxext-lock`` next to the folder ``NAME`` (beside, not inside: most
outputs are written into a temporary sibling and renamed into place, and a training run must be
lockable before its folder exists). It holds the holder's pid, host, process start time, start date and
command line.

A lock whose holder is gone is stale: on the same host, a pid that no longer runs (or now belongs to a
process started at another time, or is a zombie) is detected, the lock is cleared and a note printed.
A lock taken on another host cannot be checked from here; the message says which file to remove once
that run has really stopped.

Locks are re-entrant within a process (``search`` writes its model folder through ``extend``'s writer,
both taking the lock of the same folder) and released when the block ends, also on an exception. A
process killed with SIGKILL leaves its lock behind, which the next writer clears as stale.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ctxext.errors import InputError, disk_full_message, is_disk_full

LOCK_SUFFIX = ".ctxext-lock"
# A lock file is created empty and written at once; one still empty this long after creation lost its writer.
_EMPTY_GRACE_S = 5.0
# Lock paths this process holds, with their nesting depth (locks are re-entrant).
_HELD: dict[str, int] = {}


def lock_path(folder: str | Path) -> Path:
    """The lock file of ``folder``: ``.NAME.ctxext-lock`` beside it.

    The parent's links are resolved, so two spellings of one place share one lock.
    """
    folder = Path(os.path.abspath(folder))
    return Path(os.path.realpath(folder.parent)) / f".{folder.name}{LOCK_SUFFIX}"


def _proc_start(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (Linux ``/proc``), ``None`` where not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the holder of a lock taken on this host still runs (the same process, not a reused pid)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    if _is_zombie(pid):
        return False
    started = holder.get("proc_start")
    return started is None or _proc_start(pid) in (None, started)


def _read(path: Path) -> dict[str, Any] | None:
    """The holder recorded in a lock file; ``{}`` while it is being written; ``None`` once it is gone."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _disk_full(flag: str, folder: Path, exc: OSError) -> str | None:
    """The one full-disk message when the lock file found no room (the disk was full before the command began)."""
    return disk_full_message(flag, folder, exc) if is_disk_full(exc) else None


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host h, started 2026-12-01 15:00:00 UTC: `ctxext train …``` for messages."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"
    if holder.get("command"):
        text += f": `{holder['command']}`"
    return text


def _stale_reason(path: Path, holder: dict[str, Any]) -> str | None:
    """Why the lock is stale, or ``None`` when its holder may still run."""
    if not holder:
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            return None
        return f"it stayed empty for {age:.0f} s" if age > _EMPTY_GRACE_S else None
    if holder.get("host") != socket.gethostname():
        return None
    return None if _alive(holder) else f"{describe_holder(holder)}; that process is no longer running"


def held(folder: str | Path) -> bool:
    """Whether another writer may hold ``folder``'s lock now: the file is there and not stale.

    A lock whose holder is gone on this host is not held (the next writer clears it); one taken on another host
    counts as held, since it cannot be checked from here.
    """
    path = lock_path(folder)
    holder = _read(path)
    return holder is not None and _stale_reason(path, holder) is None


def _clear_stale(path: Path, holder: dict[str, Any]) -> bool:
    """Remove a stale lock, unless another process replaced it meanwhile; whether it was removed."""
    # Renamed first, then checked: two processes clearing the same stale lock must not remove a fresh one.
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return True  # someone else cleared it
    if (_read(aside) or {}) == holder:
        aside.unlink(missing_ok=True)
        return True
    try:  # it was a fresh lock: put it back (link fails if yet another one appeared)
        os.link(aside, path)
    except OSError:
        pass
    aside.unlink(missing_ok=True)
    return False


def _record(command: str | None) -> bytes:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "proc_start": _proc_start(os.getpid()),
        "command": command or " ".join(["ctxext", *sys.argv[1:]]),
    }
    return (json.dumps(holder) + "\n").encode()


def _acquire(path: Path, flag: str, folder: Path, command: str | None, note: Callable[[str], None]) -> None:
    for _ in range(20):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is None:
                continue  # released meanwhile: try again
            if not holder:
                time.sleep(0.05)  # being written
                holder = _read(path)
                if holder is None:
                    continue
            reason = _stale_reason(path, holder or {})
            if reason is None:
                raise InputError(_busy_message(flag, folder, path, holder or {})) from None
            if _clear_stale(path, holder or {}):
                note(f"note: cleared the stale lock {path}: {reason}")
            continue
        except OSError as exc:
            raise InputError(
                _disk_full(flag, folder, exc)
                or f"{flag} {folder}: cannot create its lock file {path} ({exc.strerror or exc}); "
                "choose a writable place"
            ) from None
        try:
            os.write(fd, _record(command))
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise InputError(
                _disk_full(flag, folder, exc)
                or f"{flag} {folder}: cannot write its lock file {path} ({exc.strerror or exc})"
            ) from None
        os.close(fd)
        return
    raise InputError(f"{flag} {folder}: its lock {path} keeps changing; another writer is starting there")


def _busy_message(flag: str, folder: Path, path: Path, holder: dict[str, Any]) -> str:
    who = describe_holder(holder) if holder else "a process that is just starting"
    remote = holder.get("host") not in (None, socket.gethostname())
    gone = (
        f"If that run has stopped (on host {holder.get('host')}, which cannot be checked from here), delete {path}."
        if remote
        else f"A lock whose process has ended is cleared automatically; {path} is the lock file."
    )
    return (
        f"{flag} {folder}: another ctxext command is writing there ({who}). Nothing was done. Wait for it to "
        f"finish (or stop it), or choose another {flag}. {gone}"
    )


def _stderr_note(message: str) -> None:
    print(message, file=sys.stderr)


@contextmanager
def folder_lock(
    folder: str | Path,
    flag: str = "--out",
    command: str | None = None,
    note: Callable[[str], None] = _stderr_note,
) -> Iterator[Path]:
    """Hold the lock of an output folder for the duration of the block.

    Args:
        folder: the output folder (it need not exist; its parent is created for the lock file).
        flag: the option or key that named the folder, for messages.
        command: the command line recorded for other writers (default: this process's arguments).
        note: receives the note printed when a stale lock is cleared.

    Yields:
        The lock file's path.

    Raises:
        InputError: another live process holds the folder's lock, or the lock cannot be written.
    """
    path = lock_path(folder)
    key = str(path)
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield path
        finally:
            _HELD[key] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{flag} {folder}: cannot create {path.parent} ({exc.strerror or exc})") from None
    _acquire(path, flag, Path(folder), command, note)
    _HELD[key] = 1
    try:
        yield path
    finally:
        del _HELD[key]
        _release(path)


def _release(path: Path) -> None:
    # Removed only while it is still this process's lock (a user may have deleted and someone re-taken it).
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        try:
            path.unlink()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
