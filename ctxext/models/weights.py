"""A model folder's weight files: which they are, whether they can be read, and a fingerprint of them.

The fingerprint identifies the *base weights* a training run was made on, so that merge, evaluation,
resume and push can refuse a base that changed under the same path (an adapter merged into other
weights loads, runs and is silently wrong). It must stay cheap on a 15 GB checkpoint, so it does not
hash everything: per weight file it hashes the name, the size, the safetensors header (every tensor's
name, dtype, shape and offsets) and 16 evenly spaced 64 KiB samples of the data (1 MiB per file).
Two different trainings of the same architecture differ in every sampled byte range; an edit confined
to a few tensors that no sample touches would go unnoticed (documented, accepted).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

from ctxext.errors import InputError

if TYPE_CHECKING:
    from ctxext.artifacts.run_record import RunRecord

_SAMPLES = 16
_SAMPLE_BYTES = 64 * 1024
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
FINGERPRINT_SCHEME = "ctxext-weights-v1: name, size, safetensors header, 16 × 64 KiB samples per file"


WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(folder: str | Path, with_index: bool = False) -> list[Path]:
    """The weight files of a model folder: ``*.safetensors``, else ``pytorch_model*.bin`` (sorted).

    Args:
        folder: the model folder.
        with_index: add the sharded checkpoint's index file, when there is one (what a copy must carry).
    """
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if not files:
        files = sorted(p for p in folder.glob("*.bin") if p.is_file() and p.name.startswith("pytorch_model"))
    if with_index:
        files += [folder / name for name in WEIGHT_INDEXES if (folder / name).is_file()]
    return files


def check_weights_readable(folder: str | Path) -> list[Path]:
    """Check that every weight file of a model folder is complete and parseable, without loading it.

    safetensors files must have a valid header whose tensors exactly cover the file (a truncated file
    fails); a sharded index must name only files that exist; ``.bin`` files must open as torch archives.

    Args:
        folder: the model folder.

    Returns:
        The weight files.

    Raises:
        InputError: naming the damaged file and what to do.
    """
    folder = Path(folder)
    files = weight_files(folder)
    if not files:
        raise InputError(f"{folder} has no weight files (*.safetensors or pytorch_model*.bin); point at a model folder")
    for index_name in WEIGHT_INDEXES:
        index = folder / index_name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError) as exc:
                raise InputError(f"{index} is damaged ({exc}); download or save the model again") from None
            missing = sorted(s for s in shards if not (folder / s).is_file())
            if missing:
                raise InputError(f"{index} names missing weight files: {', '.join(missing)}; download them again")
    for path in files:
        check_file_readable(path, "Download or save the model again.")
    return files


def check_file_readable(path: str | Path, fix: str) -> None:
    """Check that one weight or JSON file is whole: a safetensors header covering the file, a torch archive, JSON.

    Cheap (headers only): what a loader, a merge or an upload reads first, checked before any work.

    Args:
        path: the file (``.safetensors``, ``.bin`` / ``.pt`` / ``.pth`` or ``.json``; others are not checked).
        fix: what to do when it is damaged, appended to the message.

    Raises:
        InputError: naming the file, what is wrong and ``fix``.
    """
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as handle:
                handle.keys()
        elif path.suffix in (".bin", ".pt", ".pth"):
            import torch

            torch.load(path, map_location="meta", weights_only=True, mmap=True)
        elif path.suffix == ".json":
            json.loads(path.read_text())
    except Exception as exc:  # safetensors / torch / json raise several types for a damaged file
        what = "weight file" if path.suffix != ".json" else "JSON file"
        raise InputError(
            f"{what} {path} cannot be read ({type(exc).__name__}: {str(exc).strip() or 'damaged'}); it is "
            f"truncated or corrupt. {fix}"
        ) from None


# What to do about a damaged file in a training run folder (the adapter, its config).
RUN_DAMAGED = "The run folder is damaged: train again or restore the file."


def check_adapter_readable(adapter_dir: str | Path) -> None:
    """Check a LoRA adapter folder's config and weights before peft reads them (peft's own errors are tracebacks).

    Raises:
        InputError: naming the damaged file and :data:`RUN_DAMAGED`.
    """
    folder = Path(adapter_dir)
    for path in [folder / "adapter_config.json", *sorted(folder.glob("adapter_model.*"))]:
        if path.is_file():
            check_file_readable(path, RUN_DAMAGED)


def _header(path: Path) -> bytes:
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            return b""
        (length,) = struct.unpack("<Q", raw)
        return handle.read(min(length, 100 * 2**20))


def fingerprint(folder: str | Path) -> str:
    """A cheap fingerprint of a model folder's weights (see the module docstring for what it covers).

    Args:
        folder: the model folder.

    Returns:
        ``"sha256:<hex>"``.

    Raises:
        InputError: no weight files.
    """
    folder = Path(folder)
    files = weight_files(folder)
    if not files:
        raise InputError(f"{folder} has no weight files to fingerprint")
    digest = hashlib.sha256()
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        if path.suffix == ".safetensors":
            digest.update(_header(path))
        with open(path, "rb") as handle:
            for k in range(_SAMPLES):
                handle.seek(max(0, (size - _SAMPLE_BYTES) * k // max(_SAMPLES - 1, 1)))
                digest.update(handle.read(_SAMPLE_BYTES))
    return "sha256:" + digest.hexdigest()


def check_fingerprint(folder: str | Path, expected: str | None, what: str) -> None:
    """Refuse a base model folder whose weights are not the ones a run was trained on.

    Args:
        folder: the base model folder now found at the run's ``base_model`` path.
        expected: the run's recorded fingerprint (``None`` for runs made before fingerprints: not checked).
        what: what is being done, for the message (``merge``, ``resume`` …).

    Raises:
        InputError: the fingerprints differ.
    """
    if not expected:
        return
    actual = fingerprint(folder)
    if actual != expected:
        raise InputError(
            f"{what}: the base weights in {folder} are not the ones this run was trained on (fingerprint "
            f"{actual[:19]}… ≠ recorded {expected[:19]}…). An adapter applied to other weights is silently wrong. "
            "Point at the original base (run.json base_model / base_model_resolved), or train again on this one."
        )


def check_run_base(run: RunRecord, what: str) -> None:
    """Check that the base a run names is still the one it was trained on, when it is on disk.

    Runs written before fingerprints existed (no ``base_fingerprint``) and bases not present locally are
    not checked.

    Args:
        run: the run's record.
        what: the command, for the message.

    Raises:
        InputError: the base's weights changed.
    """
    base = run.base_model_resolved
    if run.base_fingerprint and base and (Path(base) / "config.json").is_file():
        check_fingerprint(Path(base), run.base_fingerprint, what)
