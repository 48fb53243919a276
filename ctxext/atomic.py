"""Output folders that appear whole or not at all, and that never replace what ctxext did not write.

Every command that writes a folder goes through :func:`atomic_folder`: the content is written into a
temporary sibling and renamed into place. Each folder carries a small manifest
(:data:`OUTPUT_MARKER`) naming the kind of output and the files ctxext wrote. An existing, non-empty
output is replaced only with ``overwrite`` and only when its manifest says ctxext wrote every file in
it: a user's own files, a model folder or a training run are never deleted, whatever the flags.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ctxext.artifacts.lock import folder_lock
from ctxext.errors import InputError, disk_full_message, is_disk_full

OUTPUT_MARKER = ".ctxext-output.json"
# Files whose presence says "this folder is someone's model / training run": named in the refusal.
_PRECIOUS = {
    "run.json": "a ctxext training run",
    "config.json": "a model folder",
    "adapter_config.json": "an adapter folder",
    "model.safetensors": "a model folder",
}
_SHOWN = 5


def _listing(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink()}


def read_manifest(folder: str | Path) -> dict | None:
    """The manifest of a folder ctxext wrote, or ``None`` when there is none (or it is unreadable)."""
    path = Path(folder) / OUTPUT_MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), list) else None


def _contains_cwd(out: Path) -> bool:
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    resolved = out.resolve()
    return resolved == cwd or resolved in cwd.parents


def check_output(out: str | Path, kind: str, overwrite: bool = False, flag: str = "--out") -> Path:
    """Check, before any work, that ``out`` can be written as a ``kind`` output without losing anything.

    Args:
        out: the output folder.
        kind: what ctxext writes there (``report``, ``model``, ``hub-staging`` …); ``overwrite`` replaces
            only a folder of the same kind.
        overwrite: replace an existing non-empty folder that ctxext wrote.
        flag: the option or key that named ``out``, for messages.

    Returns:
        ``out`` as a path.

    Raises:
        InputError: ``out`` is a file, a symbolic link, the working folder (or one above it), not writable, a
            non-empty folder without ``overwrite``, or a folder holding files ctxext did not write there.
    """
    out = Path(out)
    if str(out) in ("", ".") or _contains_cwd(out):
        raise InputError(
            f"{flag} {out}: is the current folder (or contains it); ctxext writes a new folder there and will not "
            f"replace the one you are in. Choose a new folder name, e.g. {_given(flag, 'results/NAME')}"
        )
    if out.is_symlink():
        _refuse_link(out, flag)
    if out.exists() and not out.is_dir():
        raise InputError(f"{flag} {out}: is a file, not a folder; choose a folder path that does not exist yet")
    if out.is_dir() and any(out.iterdir()):
        _check_replaceable(out, kind, overwrite, flag)
    parent = out.parent if str(out.parent) else Path(".")
    probe_from = parent
    while not probe_from.exists() and probe_from != probe_from.parent:
        probe_from = probe_from.parent
    if probe_from.exists() and (not probe_from.is_dir() or not os.access(probe_from, os.W_OK | os.X_OK)):
        what = "is a file" if not probe_from.is_dir() else "is not writable"
        raise InputError(f"{flag} {out}: {probe_from} {what}; choose an output folder in a writable place")
    return out


def _given(flag: str, value: str) -> str:
    """How ``value`` is given on the command line: ``--out VALUE``, ``key=VALUE``, or ``VALUE as OUT``.

    A positional argument is named in capitals (``OUT``); a recipe key holds a dot.
    """
    if flag.isupper():
        return f"{value} as {flag}"
    return f"{flag}={value}" if "." in flag and not flag.startswith("-") else f"{flag} {value}"


def _refuse_link(out: Path, flag: str) -> None:
    # A link as the output folder is refused, whatever it points to and whatever the flags: following it would
    # write into (and with --overwrite replace) a folder the user named elsewhere, perhaps not one ctxext wrote;
    # replacing the link would silently leave the output somewhere the user did not look. The real path is
    # unambiguous, so the message gives it. Links above the output (runs/ -> /scratch/runs) are fine.
    target = out.readlink()
    if not out.exists():
        raise InputError(
            f"{flag} {out}: is a symbolic link to {target}, which does not exist; remove the link or choose "
            "another folder"
        )
    # A flag or recipe key the user can change gets the real path; a fixed place (push's RUN/hub) only the removal.
    fix = "Remove the link; ctxext makes a real folder there."
    if flag.startswith("-") or "." in flag or flag.isupper():
        fix = f"Give the real path ({_given(flag, shlex.quote(str(out.resolve())))}) or remove the link."
    raise InputError(
        f"{flag} {out}: is a symbolic link to {target}; ctxext does not write through a link, so "
        f"nothing was changed. {fix}"
    )


def _check_replaceable(out: Path, kind: str, overwrite: bool, flag: str) -> None:
    precious = [desc for name, desc in _PRECIOUS.items() if (out / name).exists()]
    manifest = read_manifest(out)
    ours = manifest is not None and manifest.get("kind") == kind
    if not overwrite:
        hint = " pass --overwrite to replace it, or" if ours else ""
        raise InputError(f"{flag} {out}: already exists and is not empty;{hint} choose another {flag}")
    if manifest is None or not ours:
        what = precious[0] if precious else "a folder ctxext did not write"
        if manifest is not None:
            what = f"a ctxext {manifest.get('kind')} folder, not a {kind} folder"
        raise InputError(
            f"{flag} {out}: is {what}; ctxext replaces only a {kind} folder it wrote itself, so nothing was "
            f"changed. Choose another {flag}."
        )
    foreign = sorted(_listing(out) - set(manifest["files"]) - {OUTPUT_MARKER})
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else "")
        raise InputError(
            f"{flag} {out}: holds files ctxext did not write there ({shown}); --overwrite would delete them, so "
            f"nothing was changed. Move them away or choose another {flag}."
        )


def write_manifest(folder: Path, kind: str) -> None:
    """Record ``kind`` and every file now in ``folder`` as written by ctxext."""
    files = sorted(_listing(folder) - {OUTPUT_MARKER})
    (folder / OUTPUT_MARKER).write_text(json.dumps({"kind": kind, "files": files}, indent=1) + "\n")


@contextmanager
def atomic_folder(
    out: str | Path, kind: str = "output", overwrite: bool = False, flag: str = "--out"
) -> Iterator[Path]:
    """Yield a temporary folder next to ``out`` that becomes ``out`` when the block succeeds.

    On an exception nothing is left behind (neither the temporary folder nor a partial ``out``), and a
    previous ``out`` is untouched. An existing non-empty ``out`` is replaced only with ``overwrite``,
    and only when ctxext wrote all of it as the same ``kind`` (see :func:`check_output`); it is moved
    aside first, so there is no moment when a reader finds a half-written folder at ``out``.

    Args:
        out: the final folder.
        kind: what is written (recorded in the folder's manifest).
        overwrite: replace an existing folder of the same kind that ctxext wrote.
        flag: the option that named ``out``, for messages.

    Yields:
        The temporary folder to write into.

    Raises:
        InputError: ``out`` cannot be written without losing something (see :func:`check_output`), another
            process is writing it (:func:`ctxext.artifacts.lock.folder_lock`), or the disk filled up.
    """
    check_output(out, kind, overwrite, flag)  # a refusal needs no lock (and leaves no lock file behind)
    # Held already by a writer that locked ``out`` before its work; re-entrant, so this costs nothing then.
    with folder_lock(out, flag):
        with _atomic_folder(Path(out), kind, overwrite, flag) as tmp:
            yield tmp


@contextmanager
def _atomic_folder(out: Path, kind: str, overwrite: bool, flag: str) -> Iterator[Path]:
    out = check_output(out, kind, overwrite, flag)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        reason = disk_full_message(flag, out, exc) if is_disk_full(exc) else None
        raise InputError(
            reason or f"{flag} {out}: cannot create it ({exc.strerror or exc}); choose a writable place"
        ) from None
    try:
        yield tmp
        write_manifest(tmp, kind)
        if out.exists():
            # Checked again: the folder may have changed while the work ran.
            check_output(out, kind, overwrite, flag)
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except Exception as exc:  # a full disk surfaces as OSError, or wrapped by safetensors / torch writers
        if not is_disk_full(exc, out.parent):
            raise
        raise InputError(disk_full_message(flag, out, exc)) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_writable(folder: str | Path, what: str, fix: str) -> None:
    """Check, before any work, that files can be created in an existing ``folder`` (a probe file, then removed).

    A probe rather than permission bits: it also answers for read-only mounts, ACLs and full quotas.

    Args:
        folder: the folder a command will write into.
        what: how the message names it (a flag, ``RUN`` …).
        fix: what to do about it, appended to the message.

    Raises:
        InputError: naming ``folder``, the reason and ``fix``.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".ctxext-probe-", dir=folder)
    except OSError as exc:
        raise InputError(f"{what} {folder}: cannot write there ({exc.strerror or exc}); {fix}") from None
    os.close(fd)
    os.unlink(probe)


def write_json_atomic(path: Path, data: dict) -> None:
    """Write a JSON file through a temporary sibling, so a reader never sees half of it (nor a full disk's half).

    Args:
        path: the file to write (its folder exists).
        data: a JSON-ready dict (anything else is written as its ``str``).
    """
    text = json.dumps(data, indent=2, default=str) + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        if not is_disk_full(exc) or not path.is_file():
            raise
        # A full disk has no room for a second copy: rewrite in place (the blocks it frees are the ones it needs),
        # so a run record can still say "interrupted" and how to resume.
        path.write_text(text)
    finally:
        tmp.unlink(missing_ok=True)


def check_inputs_outside(out: str | Path, inputs: list[str | Path], flag: str = "--out", report: bool = False) -> None:
    """Refuse an output folder that is, or contains, one of the command's inputs (a model, a run).

    Args:
        out: the output folder.
        inputs: input paths (non-paths such as Hub ids are ignored).
        flag: the option that named ``out``, for messages.
        report: ``out`` is an evaluation report (the message then shows where a run's report goes).

    Raises:
        InputError: naming the input that would be replaced.
    """
    target = Path(out).resolve()
    for ref in inputs:
        path = Path(str(ref)).expanduser()
        if not path.exists():
            continue
        resolved = path.resolve()
        if resolved == target or target in resolved.parents:
            example = f" (e.g. {flag} {Path(str(ref)) / 'eval'} for a report on a run)" if report else ""
            raise InputError(
                f"{flag} {out}: is (or contains) the input {ref}; writing there would replace it. Write the "
                f"output to a new folder instead{example}."
            )
