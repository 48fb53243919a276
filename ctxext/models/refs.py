"""The one rule for what a reference that is not on disk names: a Hub repository id, or a mistyped path.

Used for models (``org/name``), data sets (``name`` or ``org/name``) and the ids a model card may link to.
"""

from __future__ import annotations

import re
from pathlib import Path

# Hub ids: "name" or "org/name", letters, digits, "-", "_", "." (no "..", no leading/trailing separator).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def is_hub_id(ref: str | None, *, bare: bool = False) -> bool:
    """Whether ``ref`` can name a Hub repository, as opposed to a local path or ``builtin:NAME``.

    Args:
        ref: the reference as the user gave it.
        bare: accept a name without an organisation (data sets such as ``pg19``); models need ``org/name``.

    Returns:
        ``False`` for anything that exists on disk, starts with ``/``, ``.``, ``~`` or ``builtin:``, has a
        backslash or ``..``, or more than one ``/``.
    """
    if not ref or ref.startswith(("/", ".", "~", "builtin:")) or "\\" in ref or ".." in ref:
        return False
    slashes = ref.count("/")
    return (slashes == 1 or (bare and slashes == 0)) and bool(_HUB_ID.match(ref)) and not Path(ref).exists()
