"""Peak-memory measurement shared by the benchmarks: ``/proc`` readings and a watched child process.

A benchmark cell runs in a fresh Python process so that its peak resident set (``VmHWM``) belongs to that
cell alone; the parent samples the child's ``VmRSS`` as a cross-check and kills it above a memory budget or
past a time limit. The child prints one JSON object as its last stdout line.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def status_kb(field: str, pid: int | str = "self") -> int:
    """A ``/proc/<pid>/status`` memory field in KiB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def peak_rss_mb() -> float:
    """This process's peak resident set so far (``VmHWM``), in MiB."""
    return status_kb("VmHWM") / 1024


def mem_total_gb() -> float:
    """The machine's RAM in GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def run_watched(cmd: list[str], threads: int, budget_mb: float, timeout: float, env: dict | None = None) -> dict:
    """Run a child command, watching its memory and time; return its JSON result.

    Args:
        cmd: the child's command line (it prints one JSON object as its last stdout line).
        threads: ``OMP_NUM_THREADS`` for the child.
        budget_mb: kill the child when its resident set exceeds this.
        timeout: kill the child after this many seconds.
        env: extra environment variables for the child.

    Returns:
        The child's JSON with ``wall``, ``watched_mb`` (the parent's own RSS samples, every 0.2 s) and
        ``ok: True``; or ``{"ok": False, "reason": ..., "peak_mb": watched peak, "wall": ...}``.
    """
    env = dict(
        os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(env or {})
    )
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watched_peak = 0
    reason = None
    while proc.poll() is None:
        watched_peak = max(watched_peak, status_kb("VmRSS", proc.pid))
        if watched_peak / 1024 > budget_mb:
            reason = f"over {budget_mb / 1024:.0f} GB"
        elif time.monotonic() - start > timeout:
            reason = f"timeout {timeout:.0f} s"
        if reason:
            proc.kill()
            break
        time.sleep(0.2)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - start
    if reason is None and proc.returncode == 0:
        result = json.loads(stdout.strip().splitlines()[-1])
        result.update(wall=wall, watched_mb=watched_peak / 1024, ok=True)
        return result
    if reason is None:
        last = (stderr.strip().splitlines() or ["?"])[-1]
        reason = f"exit {proc.returncode}: {last[:160]}"
    return {"ok": False, "reason": reason, "peak_mb": watched_peak / 1024, "wall": wall}


def training_step(recipe: Any, loaded: Any, loss: str) -> Callable[[Any], float]:
    """One optimizer step of ctxext's training path on a ``(1, T)`` id tensor; returns the step's loss.

    ``loss``: ``chunked`` (the training loop's :class:`ctxext.training.run.CausalLMWithChunkedLoss`) or ``full``
    (transformers' own loss over the full logits, the baseline).
    """
    import torch

    from ctxext.training.run import CausalLMWithChunkedLoss, shifted_labels
    from ctxext.training.steps import make_optimizer

    peft_model = loaded.model
    wrapper = CausalLMWithChunkedLoss(peft_model, recipe.train.loss_chunk_size).train()
    params = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer, _ = make_optimizer(recipe, params, torch.device("cpu"))

    def step(x: Any) -> float:
        if loss == "chunked":
            total, n = wrapper(x, shifted_labels(x))
            value = total / n
        else:
            value = peft_model(input_ids=x, labels=x).loss
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(value.detach())

    return step
