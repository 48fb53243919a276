"""ctxext's cache of built models: one folder per build, complete or absent.

Built-in models and converted GGUF files are written once, under ``$CTXEXT_CACHE`` (default
``~/.cache/ctxext``), and reused. A build writes into a temporary sibling that is renamed into place only
when it succeeded, so a crash, a full disk or a bad input never leaves a half-written model where the next
run would find it; a second process that asks for the same folder meanwhile waits for the first instead of
building it again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """The ctxext cache folder (``$CTXEXT_CACHE`` or ``~/.cache/ctxext``), created if needed."""
    root = os.environ.get("CTXEXT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ctxext"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def is_complete(folder: Path) -> bool:
    """Whether a cached model folder is there (it appears only whole: see :func:`build_once`)."""
    return (folder / "config.json").is_file()


@contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    # A blocking advisory lock: the second process waits for the first build rather than repeating it.
    try:
        import fcntl
    except ImportError:  # not POSIX: two processes may both build; the rename below keeps the cache whole
        yield
        return
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """The folder ``target``, built by ``build`` into a temporary sibling and renamed into place, once.

    Args:
        target: the cached folder (its parent is created).
        build: writes a complete model folder into the folder it is given; anything it raises propagates
            and nothing is left behind.

    Returns:
        ``target``.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.building"
    try:
        with _exclusive(lock):
            if not is_complete(target):  # else built by another process while this one waited
                _build_into(target, build)
    finally:
        # Nothing of a build stays beside the folder; a process still waiting holds the file open and goes on.
        lock.unlink(missing_ok=True)
    return target


def _build_into(target: Path, build: Callable[[Path], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        if target.exists() and not is_complete(target):  # the leftover of a build killed mid-rename
            shutil.rmtree(target, ignore_errors=True)
        try:
            tmp.rename(target)
        except OSError:
            if not is_complete(target):  # not a concurrent build that finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
