"""GGUF files as models: checked, dequantized by transformers, converted once to a float32 folder in the cache.

A model reference names a GGUF file when it is a path ending in ``.gguf`` or ``SOURCE::NAME`` — a folder (or a Hub
id) and the file's name in it, the two arguments of transformers' ``from_pretrained(SOURCE, gguf_file=NAME)``
(:func:`split_gguf_ref`; :func:`ctxext.models.sources.resolve_model_path` fetches a Hub file).
Such a reference resolves to an ordinary Hugging Face model folder under ``$CTXEXT_CACHE/gguf``, keyed by the
file's SHA-256, so every command (inspect, extend, train, eval, merge …) works on it as on any folder, and the
conversion (transformers' GGUF support dequantizes every tensor to float32) happens once per file.

transformers refuses to ``save_pretrained`` a GGUF-loaded model (it is marked as quantized with gguf), so the
conversion rebuilds the model from its config without the quantization block, loads the dequantized state dict,
ties the embeddings again where the file has no separate output matrix, and saves that, with the tokenizer (and
its chat template) that transformers reads from the same file. The folder records the file it came from
(:data:`SOURCE_FILE`: name and digest), which training copies into ``run.json`` and the model card shows.

A file is checked before anything is written: that it is GGUF (its magic bytes), complete (every tensor's data
inside the file), of an architecture transformers can load as a causal LM, with tensor types gguf can
dequantize. Otherwise: an :class:`~ctxext.errors.InputError` naming the file and what is supported, and nothing
in the cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxext.errors import CtxextError, InputError
from ctxext.models.cache import build_once, cache_dir, is_complete

GGUF_SEPARATOR = "::"
SOURCE_FILE = "ctxext_gguf.json"
GGUF_INSTALL = "pip install gguf"
_MAGIC = b"GGUF"
# Tensor types transformers reads without gguf's dequantizers (plain arrays).
_PLAIN_TYPES = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
# Digests already computed in this process: (path, size, mtime) -> sha256 (a reference is resolved many times).
_DIGESTS: dict[tuple[str, int, int], str] = {}


@dataclass
class GgufInfo:
    """What a GGUF file holds, read from its header without dequantizing anything.

    Attributes:
        path: the file.
        architecture: llama.cpp's ``general.architecture`` (``llama``, ``qwen2`` …).
        model_type: the transformers model type it loads as.
        name: ``general.name``, when the file has one.
        tensor_types: the storage types of its tensors (``Q4_1``, ``F32`` …).
        tensors: the number of tensors.
        tied: the file has no separate output matrix (the embeddings are tied).
        parameters: the number of weights in its tensors.
    """

    path: Path
    architecture: str
    model_type: str
    name: str | None
    tensor_types: list[str] = field(default_factory=list)
    tensors: int = 0
    tied: bool = False
    parameters: int = 0


def split_gguf_ref(ref: str) -> tuple[str, str] | None:
    """``(source, file name)`` of a reference that names a GGUF file, else ``None``.

    Args:
        ref: a model reference: a path ending in ``.gguf`` (source: its folder) or ``SOURCE::NAME`` (a folder or a
            Hub id and the file's name in it).

    Raises:
        InputError: ``SOURCE::NAME`` with either part empty.
    """
    if GGUF_SEPARATOR in ref:
        source, name = ref.split(GGUF_SEPARATOR, 1)
        if not source or not name:
            raise InputError(
                f"{ref}: write a GGUF reference as FOLDER{GGUF_SEPARATOR}FILE.gguf (a folder or Hub id, and the "
                "file's name in it)"
            )
        return source, name
    if ref.lower().endswith(".gguf"):
        path = Path(ref).expanduser()
        return str(path.parent), path.name
    return None


def gguf_digest(path: Path) -> str:
    """``sha256:<hex>`` of a file, computed once per process (and remembered in the cache for converted files)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    memo = _memo_path()
    known = _read_memo(memo)
    digest = known.get(_memo_key(key))
    if digest is None:
        sha = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                sha.update(chunk)
        digest = "sha256:" + sha.hexdigest()
    _DIGESTS[key] = digest
    return digest


def _memo_path() -> Path:
    return cache_dir() / "gguf" / "digests.json"


def _memo_key(key: tuple[str, int, int]) -> str:
    return f"{key[0]}|{key[1]}|{key[2]}"


def _read_memo(memo: Path) -> dict[str, str]:
    try:
        data = json.loads(memo.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remember_digest(path: Path, digest: str) -> None:
    # Written only for files whose conversion is in the cache: a 5 GB file is hashed once, not per command.
    stat = path.stat()
    memo = _memo_path()
    known = _read_memo(memo)
    known[_memo_key((str(path.resolve()), stat.st_size, stat.st_mtime_ns))] = digest
    tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(memo)
    except OSError:  # a memo is an optimisation: a read-only cache still works
        tmp.unlink(missing_ok=True)


def _supported() -> str:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The table also holds the non-architecture sections "general" and "tokenizer".
    return ", ".join(sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}))


def _reader(path: Path) -> Any:
    """The gguf package's reader on a file that starts like GGUF, or an InputError saying what the file is not."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise InputError(f"{path}: reading GGUF files needs the gguf package: {GGUF_INSTALL}") from None
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != _MAGIC:
        raise InputError(
            f"{path} is not a GGUF file (it starts with {head!r}, not {_MAGIC!r}); a model is a model folder, a Hub "
            f"id, builtin:NAME, a .gguf file or FOLDER{GGUF_SEPARATOR}FILE.gguf"
        )
    try:
        return GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError / IndexError / struct errors on a damaged file
        raise InputError(
            f"{path} cannot be read as GGUF ({type(exc).__name__}: {str(exc).strip()[:160] or 'damaged'}): it is "
            "truncated or corrupt. Download it again."
        ) from None


def check_gguf(path: Path) -> GgufInfo:
    """Check a GGUF file without dequantizing it: complete, a causal LM transformers loads, types gguf decodes.

    Args:
        path: the ``.gguf`` file.

    Returns:
        What the file holds.

    Raises:
        InputError: naming the file, what is wrong, and what is supported.
    """
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file")
    reader = _reader(path)
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if not reader.tensors or end > size:
        raise InputError(
            f"{path} is truncated: its tensors need {end:,} bytes, the file has {size:,}. Download it again."
        )
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    except ValueError as exc:
        arch = _field(reader, "general.architecture") or "?"
        if "not supported" not in str(exc):
            raise InputError(f"{path}: transformers cannot read its GGUF header ({exc})") from None
        raise InputError(
            f"{path}: transformers cannot load GGUF architecture {arch!r}; it loads these GGUF architectures: "
            f"{_supported()}"
        ) from None
    except Exception as exc:  # a header transformers cannot parse
        raise InputError(f"{path}: transformers cannot read its GGUF header ({type(exc).__name__}: {exc})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = parsed.get("config") or {}
    model_type = str(config.get("model_type", ""))
    arch = _field(reader, "general.architecture") or model_type
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise InputError(
            f"{path}: GGUF architecture {arch!r} loads as transformers model type {model_type!r}, which is not a "
            f"causal LM; ctxext extends causal LMs (GGUF architectures transformers loads: {_supported()})"
        )
    from gguf.quants import _type_traits

    decodable = _PLAIN_TYPES | {t.name for t in _type_traits}
    types = sorted({t.tensor_type.name for t in reader.tensors})
    unknown = [t for t in types if t not in decodable]
    if unknown:
        raise InputError(
            f"{path}: tensor type(s) {', '.join(unknown)} cannot be dequantized by the installed gguf package "
            f"(it decodes {', '.join(sorted(decodable))}); upgrade it ({GGUF_INSTALL} -U) or use another quantization"
        )
    return GgufInfo(
        path=path,
        architecture=arch,
        model_type=model_type,
        name=_field(reader, "general.name"),
        tensor_types=types,
        tensors=len(reader.tensors),
        tied=bool(config.get("tie_word_embeddings")),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
    )


def _field(reader: Any, key: str) -> str | None:
    entry = reader.fields.get(key)
    if entry is None or not entry.data:
        return None
    try:
        return bytes(entry.parts[entry.data[0]]).decode("utf-8", errors="replace")
    except (TypeError, ValueError):
        return None


def convert_gguf(path: Path, out: Path, digest: str | None = None, info: GgufInfo | None = None) -> dict[str, Any]:
    """Write a GGUF file as a float32 Hugging Face model folder (weights, config, tokenizer, its source record).

    Args:
        path: the ``.gguf`` file.
        out: an empty folder to write into (the caller makes it appear whole: :func:`gguf_folder`).
        digest: the file's digest, when already known.
        info: what :func:`check_gguf` read from it, when already checked.

    Returns:
        The source record written to ``out/ctxext_gguf.json``.

    Raises:
        InputError: a file :func:`check_gguf` refuses.
        CtxextError: transformers' dequantized model does not fill the rebuilt one.
    """
    info = info or check_gguf(path)
    digest = digest or gguf_digest(path)
    # SmolLM2-135M (Q4_1) converts in ~25 s on 2 CPU cores: ~5M parameters a second, to dequantize and save.
    estimate = max(5.0, info.parameters / 5e6)
    print(
        f"converting {path.name} ({info.parameters / 1e6:.3g}M parameters, {info.architecture}, "
        f"{'/'.join(info.tensor_types)}) to a float32 model folder in ctxext's cache, once per file: about "
        f"{estimate:.0f} s on 2 CPU cores",
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    model = _dequantized(path)
    model.save_pretrained(out)
    from transformers import AutoTokenizer

    # The tokenizer transformers builds from the file's vocabulary, with its chat template.
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    record = {
        "gguf_file": path.name,
        "sha256": digest,
        "bytes": path.stat().st_size,
        "architecture": info.architecture,
        "name": info.name,
        "tensor_types": info.tensor_types,
        "tied_embeddings": info.tied,
        "dtype": "float32",
        "seconds": round(time.time() - started, 1),
    }
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"converted {path.name} in {record['seconds']:.0f} s", file=sys.stderr, flush=True)
    return record


def _dequantized(path: Path) -> Any:
    """The model transformers dequantizes, rebuilt without its GGUF quantization marker so that it can be saved."""
    import torch
    from transformers import AutoModelForCausalLM

    from ctxext.models.build import load_gguf_weights

    with _no_tensor_bar():
        loaded = load_gguf_weights(path.parent, path.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise CtxextError(
            f"{path}: the dequantized tensors do not fill a {type(model).__name__} (missing "
            f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}); this GGUF cannot be converted"
        )
    model.tie_weights()
    model.generation_config = loaded.generation_config
    out_emb = model.get_output_embeddings()
    if tied and out_emb is not None and out_emb.weight is not model.get_input_embeddings().weight:
        raise CtxextError(f"{path}: the output embedding of the converted model is not tied to the input embedding")
    return model


@contextmanager
def _no_tensor_bar() -> Iterator[None]:
    # transformers draws a tqdm bar over the file's tensors that no setting turns off; in a log file it is one long
    # line of carriage returns. The conversion prints its own estimate and time instead.
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=True)  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def gguf_folder(path: Path) -> Path:
    """The cached float32 model folder of a GGUF file, converted on first use (complete or absent).

    Args:
        path: the ``.gguf`` file.

    Returns:
        The model folder (``$CTXEXT_CACHE/gguf/<stem>-<digest>``).

    Raises:
        InputError: a file that is missing or that :func:`check_gguf` refuses; nothing is written then.
    """
    if not path.is_file():
        raise InputError(f"{path}: no such GGUF file")
    digest = gguf_digest(path)
    target = cache_dir() / "gguf" / f"{path.stem}-{digest.removeprefix('sha256:')[:16]}"
    if not is_complete(target):
        info = check_gguf(path)  # bad input is refused before anything is written to the cache

        def build(out: Path) -> None:
            convert_gguf(path, out, digest, info)

        build_once(target, build)
    _remember_digest(path, digest)
    return target


def gguf_source(folder: str | Path) -> dict[str, str] | None:
    """The GGUF file a converted folder came from (``{"file", "sha256"}``), or ``None`` for any other folder."""
    path = Path(folder) / SOURCE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {"file": str(record.get("gguf_file")), "sha256": str(record.get("sha256"))}
