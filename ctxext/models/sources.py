"""Finding a model: a local folder, a Hub id, ``builtin:NAME`` or a GGUF file, with errors that say what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.models.builtin import BUILTIN_PREFIX, resolve_builtin
from ctxext.models.refs import is_hub_id


class SourceError(InputError, ValueError):
    """A model or file that cannot be found or fetched; the message says what to do."""


def hub_error_message(exc: BaseException, what: str) -> str | None:
    """A user-facing message for a Hub that is offline, unreachable, or refusing, else ``None``.

    Args:
        exc: the exception raised by huggingface_hub / transformers.
        what: what was being fetched, for the message.

    Returns:
        The message, or ``None`` when the exception is not a Hub access problem.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    names = {type(e).__name__ for e in exception_chain(exc)}
    text = " ".join(str(e) for e in exception_chain(exc))
    if "OfflineModeIsEnabled" in names or "offline mode" in text.lower() or os.environ.get("HF_HUB_OFFLINE") == "1":
        return (
            f"cannot fetch {what}: HF_HUB_OFFLINE=1 is set and it is not in the local cache. Pass a local folder, "
            "or unset HF_HUB_OFFLINE on a machine that reaches the Hub."
        )
    if names & {
        "ConnectError",
        "ConnectionError",
        "ConnectTimeout",
        "LocalEntryNotFoundError",
        "NewConnectionError",
    }:
        return (
            f"cannot fetch {what}: the Hub at {endpoint} is unreachable and it is not in the local cache. Check the "
            "network (or HF_ENDPOINT), or pass a local folder."
        )
    if names & {"RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError", "HfHubHTTPError"}:
        return (
            f"cannot fetch {what} from {endpoint}: {exc}. Check the id and revision, and log in "
            "(`hf auth login` or HF_TOKEN) for gated or private repositories."
        )
    return None


def read_error_message(exc: BaseException, path: str | Path, kind: str) -> str:
    """Why a data file could not be read, in words that say what to do.

    ``datasets`` wraps the real cause (a ``UnicodeDecodeError`` inside a ``DatasetGenerationError``, or a
    bare ``StopIteration`` for an empty file); this finds it.

    Args:
        exc: the exception raised while reading.
        path: the file or folder.
        kind: the format it was read as (``json``, ``text`` …).

    Returns:
        A one-line message naming the problem and the fix.
    """
    chain = exception_chain(exc)
    for err in chain:
        if isinstance(err, UnicodeDecodeError):
            return (
                f"{path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at position {err.start} cannot be "
                f"decoded as {err.encoding}); it is probably Latin-1 / cp1252. Convert it, e.g. "
                f"`iconv -f latin1 -t utf-8 FILE > FILE.utf8`, and point at the converted file."
            )
    if any(isinstance(err, StopIteration) for err in chain) or all(not str(err).strip() for err in chain):
        return f'{path} holds no {kind} records (is it empty?); put one record per line, e.g. {{"text": "..."}}'
    detail = next((str(err).strip() for err in reversed(chain) if str(err).strip()), type(exc).__name__)
    return f"cannot read {path} as {kind}: {detail.splitlines()[0]}"


_TEXT_LIKE = (".jsonl", ".json", ".txt", ".csv", ".md", ".py")


def check_utf8(files: list[Path], what: str = "data") -> None:
    """Check that text-like data files are UTF-8, streaming (~1 GB/s), before a loader trips over them.

    ``datasets`` reads a Latin-1 JSON Lines file without complaint and fails later, deep inside a
    ``map`` or an iteration; checking first gives one clear message instead.

    Args:
        files: the files to check (binary formats such as parquet are skipped).
        what: the option or key that named them, for the message.

    Raises:
        SourceError: the first file that is not UTF-8, with an encoding hint.
    """
    import codecs

    for path in files:
        if Path(path).suffix.lower() not in _TEXT_LIKE:
            continue
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset = 0
        with open(path, "rb") as handle:
            try:
                while chunk := handle.read(1 << 20):
                    decoder.decode(chunk)
                    offset += len(chunk)
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                shifted = UnicodeDecodeError(exc.encoding, exc.object, exc.start, exc.end, exc.reason)
                message = read_error_message(shifted, path, "text").replace(
                    f"position {exc.start}", f"byte offset {offset + exc.start}"
                )
                raise SourceError(f"{what}: {message}") from None


def exception_chain(exc: BaseException) -> list[BaseException]:
    """An exception and its causes / contexts, outermost first (library errors wrap the real one)."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _lookup_failed(ref: str, exc: BaseException) -> str:
    # A reference of the form a/b that is not a local folder was tried as a Hub id; say both, because a
    # mistyped local path (runs/my-run) is the likelier mistake.
    local = Path(ref).expanduser()
    hint = (
        f"there is no folder {ref} here ({Path.cwd()}); "
        if local.parent.exists() and str(local.parent) not in ("", ".")
        else ""
    )
    message = hub_error_message(exc, ref)
    if message is None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        message = f"cannot load {ref} as a Hub model id ({first})"
    return (
        f"{hint}{message} If {ref} is a local folder, check the path (it must hold config.json); a Hub id is "
        "written org/name."
    )


def resolve_model_path(ref: str, revision: str | None = None) -> Path:
    """A local folder for a model reference, downloading a Hub id's files if needed.

    Args:
        ref: a local folder, ``builtin:NAME``, a Hub id (``org/name``), or a GGUF file (``FILE.gguf`` or
            ``FOLDER::FILE.gguf``: converted once to a float32 folder, :mod:`ctxext.models.gguf`).
        revision: Hub revision.

    Returns:
        The folder holding ``config.json``.

    Raises:
        SourceError: the reference cannot be resolved; the message says what to do.
        InputError: a GGUF file that cannot be converted.
    """
    from ctxext.models.gguf import gguf_folder, split_gguf_ref

    gguf = split_gguf_ref(ref)
    if gguf is not None:
        return gguf_folder(_gguf_path(*gguf))
    if ref.startswith(BUILTIN_PREFIX):
        try:
            return resolve_builtin(ref[len(BUILTIN_PREFIX) :])
        except KeyError as exc:
            raise SourceError(str(exc.args[0])) from None
    path = Path(ref).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise SourceError(f"{path} has no config.json; point at a model folder (save_pretrained output)")
        return path
    if not is_hub_id(ref):
        raise SourceError(
            f"{ref} is not a folder, a built-in model (builtin:NAME), a Hub id (org/name) or a GGUF file (FILE.gguf)"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                ref,
                revision=revision,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.tiktoken"],
            )
        )
    except Exception as exc:  # huggingface_hub raises many types; translate the ones a user can fix
        raise SourceError(_lookup_failed(ref, exc)) from None


def _gguf_path(source: str, name: str) -> Path:
    # A local folder's file, or a Hub repository's (downloaded into the Hub cache like any model file).
    folder = Path(source).expanduser()
    if folder.is_dir() or not is_hub_id(source):
        return folder / name
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source, name))
    except Exception as exc:  # huggingface_hub raises many types; translate the ones a user can fix
        message = hub_error_message(exc, f"{name} of {source}")
        raise SourceError(message or f"cannot fetch {name} from {source} ({exc})") from None


def load_config(ref: str, revision: str | None = None, trust_remote_code: bool = False) -> tuple[Any, Path]:
    """Load a model's config without its weights.

    Args:
        ref: a model reference (see :func:`resolve_model_path`).
        revision: Hub revision.
        trust_remote_code: allow custom configuration code.

    Returns:
        ``(config, folder)``.
    """
    from transformers import AutoConfig

    from ctxext.models.gguf import split_gguf_ref

    if is_hub_id(ref) and not Path(ref).expanduser().exists() and split_gguf_ref(ref) is None:
        # A Hub id: fetch config.json alone, not the weights.
        try:
            config = AutoConfig.from_pretrained(ref, revision=revision, trust_remote_code=trust_remote_code)
        except Exception as exc:
            raise SourceError(_lookup_failed(ref, exc)) from None
        return config, Path(ref)
    folder = resolve_model_path(ref, revision)
    return config_from_folder(folder, trust_remote_code), folder


def config_from_folder(folder: str | Path, trust_remote_code: bool = False) -> Any:
    """Load ``config.json`` from a local model folder; a damaged or unknown config is a :class:`SourceError`.

    Args:
        folder: the model folder.
        trust_remote_code: allow custom configuration code.

    Returns:
        The transformers config.

    Raises:
        SourceError: ``config.json`` is not valid JSON, is not a JSON object, or names no model type
            transformers knows; the message says which and what to do.
    """
    import json

    from transformers import AutoConfig

    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SourceError(f"{path} is not UTF-8 text; restore the model's config.json") from None
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); fix it or restore "
            "the model's config.json"
        ) from None
    if not isinstance(data, dict):
        raise SourceError(f"{path} must hold a JSON object (the model's settings), not {type(data).__name__}")
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers / huggingface_hub raise many types for a config they reject
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        first = " ".join(lines[:2]) if lines else type(exc).__name__
        raise SourceError(
            f"{path} cannot be used by transformers ({first}); check model_type and the values in it, or restore "
            "the model's config.json"
        ) from None
