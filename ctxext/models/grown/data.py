"""The grown model's data: the stdlib split, its tokenizer, and seeded training windows.

Training windows are plain code, code with a key/value needle (``KEY_ab = 68310`` on one line,
``assert KEY_ab == 68310`` later), code with a repeated span, or code with several needles of distinct
names and the query for one of them, at distances spread uniformly over the window, so that the model
learns to use its whole window (a plain-code model of this size uses only its last few dozen tokens).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.models.builtin import stdlib_files, stdlib_split, train_bpe_tokenizer
from ctxext.models.grown.settings import GrowSettings

# (needle line ids, query prompt ids, answer ids)
Needle = tuple[list[int], list[int], list[int]]
# (stdlib root, training files, held-out files)
Split = tuple[Path, list[Path], list[Path]]


def split_files(mod: int) -> Split:
    """Deterministic train / held-out split of the standard library's source files.

    Args:
        mod: a file is held out when ``sha1(path relative to the stdlib root) % mod == 0``.

    Returns:
        (stdlib root, training files, held-out files), each list sorted by path.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    train: list[Path] = []
    heldout: list[Path] = []
    for path in stdlib_files():
        (heldout if stdlib_split(path, mod) == "heldout" else train).append(path)
    return root, train, heldout


def read_source(path: Path) -> str:
    """A source file's text (undecodable bytes replaced, as every reader of the stdlib does here)."""
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], vocab_size: int) -> Any:
    """Byte-level BPE trained on ``files`` only, wrapped like a Llama tokenizer (adds ``<s>``).

    Args:
        files: the training files.
        vocab_size: vocabulary size, special tokens included.

    Returns:
        A ``PreTrainedTokenizerFast``.
    """
    return train_bpe_tokenizer((read_source(p) for p in files), vocab_size)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without BOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_files(tokenizer: Any, files: list[Path]) -> list[np.ndarray]:
    """Token ids of each file (no BOS), in file order."""
    out = tokenizer([read_source(p) for p in files], add_special_tokens=False)["input_ids"]
    return [np.asarray(ids, dtype=np.int64) for ids in out]


class Needles:
    """Key/value needles: ``KEY_xx = NNNNN`` early, ``assert KEY_xx == NNNNN`` later.

    The ByteLevel pre-tokenizer splits ``assert KEY_ab == 68310`` before `` 68310``, so the ids of
    the prompt ``assert KEY_ab ==`` are exactly a prefix of the ids of the full query line: the
    training sequences and the retrieval prompts agree token for token.
    """

    def __init__(self, tokenizer: Any, key_names: str = "letters"):
        """Prepare the needles of ``tokenizer``.

        Args:
            tokenizer: the grown model's tokenizer.
            key_names: ``letters`` (``KEY_ab``) or ``words`` (``KEY_`` + a lowercase vocabulary entry).
        """
        self.tokenizer = tokenizer
        self.words: list[str] = []
        if key_names == "words":
            vocab = sorted(tokenizer.get_vocab())
            self.words = [w for w in vocab if w.isascii() and w.isalpha() and w.islower() and 3 <= len(w) <= 7]
        ids = range(len(tokenizer))
        # Tokens that end a line (ByteLevel joins "\n" with the next line's indentation).
        self.line_end = np.array(["\n" in tokenizer.decode([i]) for i in ids], dtype=bool)
        self.newline = encode(tokenizer, "\n")

    def sample(self, rng: np.random.Generator, key: str | None = None) -> Needle:
        """One needle: (needle line ids, query prompt ids, answer ids); ``key`` drawn unless given."""
        key = key or self.draw_key(rng)
        value = int(rng.integers(10000, 100000))
        needle = encode(self.tokenizer, f"{key} = {value}\n")
        prompt = encode(self.tokenizer, f"assert {key} ==")
        answer = encode(self.tokenizer, f" {value}")
        return needle, prompt, answer

    def draw_key(self, rng: np.random.Generator) -> str:
        """A random ``KEY_xy`` name (two lowercase letters, or one vocabulary word)."""
        if self.words:
            return "KEY_" + self.words[int(rng.integers(len(self.words)))]
        return "KEY_" + "".join(chr(97 + int(c)) for c in rng.integers(0, 26, size=2))

    def boundaries(self, code: np.ndarray) -> np.ndarray:
        """Positions in ``code`` where a new line starts (0 included): where a needle may go."""
        return np.concatenate([[0], np.nonzero(self.line_end[code])[0] + 1])


def snap(positions: np.ndarray, x: float) -> int:
    """The line start nearest to ``x``."""
    return int(positions[np.argmin(np.abs(positions - x))])


class TrainingSequences:
    """Seeded sampler of training windows: plain code, key/value needles and repeated spans."""

    def __init__(self, stream: np.ndarray, needles: Needles, s: GrowSettings, seed: int):
        """Sample windows of ``s.window`` tokens from ``stream``.

        Args:
            stream: the token stream to cut windows from.
            needles: the needle maker (its tokenizer made ``stream``).
            s: the mixture and window settings.
            seed: the sampler's seed.
        """
        self.stream, self.needles, self.s = stream, needles, s
        self.rng = np.random.default_rng(seed)

    def code(self, n: int) -> np.ndarray:
        """``n`` consecutive tokens from a random place of the stream."""
        start = int(self.rng.integers(0, len(self.stream) - n))
        return self.stream[start : start + n]

    def _query(self, prompt: list[int], answer: list[int]) -> list[int]:
        return prompt + answer + encode(self.needles.tokenizer, "\n")

    def needle_sequence(self) -> np.ndarray:
        """A window with one needle and, later, its query and answer, both at line starts."""
        needle, prompt, answer = self.needles.sample(self.rng)
        query = self._query(prompt, answer)
        n = self.s.window - len(needle) - len(query)
        code = self.code(n)
        lines = self.needles.boundaries(code)
        # Distance between needle and query uniform over the window, then both snapped to line starts.
        dist = self.rng.uniform(0, n)
        first = snap(lines, self.rng.uniform(0, n - dist))
        second = max(first, snap(lines, first + dist))
        return np.concatenate([code[:first], needle, code[first:second], query, code[second:]])

    def _distinct_needles(self, count: int) -> list[Needle]:
        keys: list[str] = []
        while len(keys) < count:
            key = self.needles.draw_key(self.rng)
            if key not in keys:
                keys.append(key)
        return [self.needles.sample(self.rng, key) for key in keys]

    def multikey_sequence(self, count: int | None = None) -> tuple[np.ndarray, tuple[int, int]]:
        """Several needles with distinct names, then the query for one of them, at line starts.

        Args:
            count: how many needles (default: drawn from 2 to ``1 + max_distractors``).

        Returns:
            The window and the ``(start, end)`` of the queried key's answer tokens in it.
        """
        count = int(self.rng.integers(2, 2 + self.s.max_distractors)) if count is None else count
        target, *others = self._distinct_needles(count)
        _, prompt, answer = target
        query = self._query(prompt, answer)
        # Four needles and a query may not fit a 64-token window: drop distractors until 8 code tokens fit.
        while others and self.s.window - len(target[0]) - sum(len(d[0]) for d in others) - len(query) < 8:
            others.pop()
        drawn = [target, *others]
        drawn = [drawn[i] for i in self.rng.permutation(len(drawn))]
        n = self.s.window - sum(len(d[0]) for d in drawn) - len(query)
        code = self.code(n)
        lines = self.needles.boundaries(code)
        # Needles at sorted random line starts, the query after the last one.
        cuts = sorted(snap(lines, x) for x in self.rng.uniform(0, n, size=len(drawn) + 1))
        parts: list[Any] = []
        last = length = answer_start = 0
        for cut, piece in zip(cuts, [d[0] for d in drawn] + [query], strict=True):
            parts += [code[last:cut], piece]
            length += cut - last
            answer_start = length + len(prompt)
            length += len(piece)
            last = cut
        return np.concatenate([*parts, code[last:]]), (answer_start, answer_start + len(answer))

    def repeat_sequence(self) -> np.ndarray:
        """A window in which a span of 8-16 tokens comes again later."""
        w = self.s.window
        code = self.code(w)
        span = int(self.rng.integers(self.s.repeat_min, self.s.repeat_max + 1))
        dist = int(self.rng.integers(span, w - span + 1))
        start = int(self.rng.integers(0, w - span - dist + 1))
        seq = np.concatenate([code[: start + dist], code[start : start + span], code[start + dist :]])
        return seq[:w]

    def batch_with_answers(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of windows and a mask of the multi-key answer tokens in it (False elsewhere)."""
        rows = []
        answers = np.zeros((size, self.s.window), dtype=bool)
        s = self.s
        for r in range(size):
            u = self.rng.random()
            if u < s.needle_share:
                rows.append(self.needle_sequence())
            elif u < s.needle_share + s.repeat_share:
                rows.append(self.repeat_sequence())
            elif u < s.needle_share + s.repeat_share + s.multikey_share:
                seq, (a0, a1) = self.multikey_sequence()
                rows.append(seq)
                answers[r, a0:a1] = True
            else:
                rows.append(self.code(s.window))
        return torch.from_numpy(np.stack(rows)), torch.from_numpy(answers)
