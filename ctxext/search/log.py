"""``search.jsonl``: one line per evaluated candidate and per generation, enough to resume a search exactly.

Line types (each a JSON object with ``type``):

* ``header`` (first line): the settings that define the search and the model's fingerprint;
* ``candidate``: index, generation, origin, factors (full float precision: JSON round-trips floats
  exactly), score, cumulative search seconds (wall and CPU);
* ``generation``: the best score and candidate after each generation;
* ``end``: why the search stopped (``generations`` or ``budget``) and the best candidate.

A resumed search replays the algorithm with the same seed, taking each candidate's score from the log
instead of evaluating it (after checking that the replay generated the very same factors), and then
continues. Everything but the time budget must match the log's header; a log written for another model,
target or objective is refused. A last line cut off by an interruption is ignored.

A score cannot be checked by replaying (the replay regenerates the factors, not the scores), and a hand-edited
score would win. So before a resumed search trusts its log, the logged candidate that would win is scored again
and must match (``SCORE_RTOL``); every other logged score is then at least that verified one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.errors import InputError

LOG_NAME = "search.jsonl"
# Settings that may differ between a log and a resumed run.
RESUMABLE_CHANGES = frozenset({"budget_seconds"})
# How far a re-scored candidate may differ from its logged score: the same model, data and code give the same
# number up to float summation order (other thread counts, another device), far below any score difference
# that changes which candidate wins.
SCORE_RTOL = 1e-3


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a model's parameter names, shapes and a sample of their values (cheap for big models).

    Args:
        model: the loaded model.

    Returns:
        16 hex digits.
    """
    h = hashlib.sha256()
    for name, param in model.named_parameters():
        h.update(name.encode())
        h.update(str(tuple(param.shape)).encode())
        sample = param.detach().reshape(-1)[:256].to(torch.float32).cpu().numpy()
        h.update(np.ascontiguousarray(sample).tobytes())
    return h.hexdigest()[:16]


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a log, in order; a truncated last line is dropped.

    Raises:
        InputError: a corrupt line before the last, or no header.
    """
    lines = path.read_text().splitlines()
    records: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # cut off by the interruption
            raise InputError(
                f"{path}: line {i + 1} is not valid JSON; the log is damaged (start afresh with --overwrite)"
            ) from None
    if not records or records[0].get("type") != "header":
        raise InputError(f"{path} has no header line; it is not a ctxext search log")
    return records


def check_resume(header: dict[str, Any], settings: dict[str, Any], fingerprint: str, path: Path) -> None:
    """Refuse to resume a log written for another model or other settings.

    Args:
        header: the log's header record.
        settings: this run's settings (JSON-ready).
        fingerprint: this run's model fingerprint.
        path: the log (for messages).

    Raises:
        InputError: naming every difference.
    """
    problems: list[str] = []
    if header.get("fingerprint") != fingerprint:
        problems.append(
            f"model: the log was written for model {header.get('settings', {}).get('model')!r} "
            f"(fingerprint {header.get('fingerprint')}), this is {settings.get('model')!r} (fingerprint {fingerprint})"
        )
    logged = header.get("settings", {})
    for key in sorted(set(logged) | set(settings)):
        if key in RESUMABLE_CHANGES or key == "model":
            continue
        if logged.get(key) != settings.get(key):
            problems.append(f"{key}: log has {logged.get(key)!r}, this run has {settings.get(key)!r}")
    if problems:
        raise InputError(
            f"cannot resume {path}: it belongs to another search.\n  "
            + "\n  ".join(problems)
            + "\nResume with the log's settings, or start a new search with another --out (or --overwrite)."
        )


def verify_logged_best(
    candidates: list[dict[str, Any]],
    path: Path,
    rescore: Callable[[np.ndarray, float], float],
    n_factors: int,
    attention: float,
) -> None:
    """Score the logged candidate that would win again, and refuse the log when it does not score what it logs.

    A resumed search takes every logged score as given, and a replay checks the factors, not the scores: a
    hand-edited score (an objective of -5, an impossible NLL) would win. Once the candidate that would win
    (the lowest finite score, the earliest on ties) is verified, every other logged score is at least a real one.

    Args:
        candidates: the log's candidate records.
        path: the log (for messages).
        rescore: scores ``(long factors, attention factor)`` with the search's objective.
        n_factors: the model's number of long factors.
        attention: the attention factor of records that do not log one.

    Raises:
        InputError: a candidate without a numeric score or with ``-inf``, a best candidate without a factor list
            of the model's size, or a best score that differs from its re-scored value by more than ``SCORE_RTOL``.
    """
    fresh = "Start afresh (`ctxext search --overwrite`, or delete the folder)"
    for record in candidates:
        score = record.get("score")
        if isinstance(score, bool) or not isinstance(score, int | float) or score == -math.inf:
            raise InputError(
                f"{path}: candidate {record.get('index')} has score {score!r}, which no search logs; the log was "
                f"edited or damaged. {fresh}"
            )
    finite = [r for r in candidates if math.isfinite(r["score"])]
    if not finite:
        return
    top = min(finite, key=lambda r: (r["score"], r.get("index", 0)))
    factors = top.get("factors")
    if not isinstance(factors, list) or len(factors) != n_factors:
        raise InputError(
            f"{path}: candidate {top.get('index')} has no list of {n_factors} factors; the log was edited or "
            f"damaged. {fresh}"
        )
    score = rescore(np.asarray(factors, dtype=np.float64), float(top.get("attention_factor", attention)))
    if not math.isclose(score, top["score"], rel_tol=SCORE_RTOL, abs_tol=1e-9):
        raise InputError(
            f"{path}: candidate {top.get('index')}, the best in the log, logs score {top['score']!r} but scores "
            f"{score:.6g} when scored again; the log was edited, or written with other data or code, so its "
            f"scores cannot be trusted and nothing was resumed. {fresh}"
        )


class SearchLog:
    """Appends records to ``search.jsonl``, flushed line by line (a kill loses at most the line being written).

    Args:
        path: the log file.
    """

    def __init__(self, path: Path):
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as a line."""
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, allow_nan=True) + "\n")
            fh.flush()
