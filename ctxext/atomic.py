"""Folders that appear whole or not at all: write into a temporary sibling, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_folder(out: str | Path) -> Iterator[Path]:
    """Yield a temporary folder next to ``out`` that replaces ``out`` when the block succeeds.

    On an exception nothing is left behind (neither the temporary folder nor a partial ``out``), and a
    previous ``out`` is untouched. A replaced ``out`` is first moved aside, so there is no moment when
    a reader finds a half-written folder at ``out``.

    Args:
        out: the final folder.

    Yields:
        The temporary folder to write into.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
