"""Training memory of PoSE rows vs full-length rows: raw peak RSS and the part the training loop adds.

For a 4.2M-parameter model most of a training process's resident memory is the process itself (Python,
torch, datasets, the tokenized data), which does not depend on the row length. So next to the raw
peak RSS (``VmHWM``, what ``metrics.jsonl`` reports as ``peak_mem_mb``) this benchmark reports the
**training memory**: the highest resident set sampled (every 5 ms) while the training loop runs, minus
the resident set when the loop starts (model loaded, data prepared, optimizer built). Both arms train the
demo's ×F mixture recipe (``recipes/default.yaml`` through ``benchmarks._common.demo_recipe``) for
a few steps, each in its own fresh process, one after the other in the same run:

* ``full`` — rows of the target length (``rope.target_length``);
* ``pose`` — PoSE rows of ``--pose-factor`` × the original window, positions reaching the target.

The loop start is observed by wrapping ``ctxext.training.run.micro_batches`` (called once, just before the
loop) in the child; nothing else changes.

    python -m benchmarks.pose_memory --factor 8 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks._memory import status_kb

ROOT = Path(__file__).resolve().parents[1]


def child(arm: str, model: str, factor: int, steps: int, pose_factor: int, out: Path) -> None:
    """Train one arm in this process and print its memory as one JSON line."""
    import ctxext.training.run as training
    from benchmarks._common import demo_recipe

    pose = pose_factor if arm == "pose" else None
    recipe = demo_recipe(out / arm, [f"model.path={model}"], factor=factor, steps=steps, pose_factor=pose)
    recipe.train.eval_every = None  # only the training loop
    recipe.train.save_every = None
    seen = {"start_kb": 0, "max_kb": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            seen["max_kb"] = max(seen["max_kb"], status_kb("VmRSS"))
            time.sleep(0.005)

    original = training.micro_batches

    def at_loop_start(*args, **kwargs):
        seen["start_kb"] = status_kb("VmRSS")
        seen["max_kb"] = seen["start_kb"]
        threading.Thread(target=sample, daemon=True).start()
        return original(*args, **kwargs)

    training.micro_batches = at_loop_start
    started = time.perf_counter()
    training.train(recipe)
    done.set()
    seen["max_kb"] = max(seen["max_kb"], status_kb("VmRSS"))
    print(
        json.dumps(
            {
                "arm": arm,
                "seq_len": recipe.seq_len,
                "peak_rss_mb": status_kb("VmHWM") / 1024,
                "rss_at_loop_start_mb": seen["start_kb"] / 1024,
                "training_mb": (seen["max_kb"] - seen["start_kb"]) / 1024,
                "seconds": time.perf_counter() - started,
            }
        )
    )


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from ctxext.cli.demo import RECIPE
    from ctxext.recipe.schema import load_recipe

    parser.add_argument("--model", default=load_recipe(RECIPE).model.path, help="base model (default: the demo's)")
    parser.add_argument("--factor", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pose-factor", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.model, args.factor, args.steps, args.pose_factor, args.out)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("full", "pose"):
            cmd = [sys.executable, "-m", __spec__.name, "--child", arm, "--out", tmp]
            cmd += ["--model", args.model, "--factor", str(args.factor), "--steps", str(args.steps)]
            cmd += ["--pose-factor", str(args.pose_factor)]
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"{arm} failed:\n{proc.stderr[-3000:]}")
            results[arm] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(json.dumps(results[arm]), flush=True)
    full, pose = results["full"], results["pose"]
    print(
        f"×{args.factor}, {args.steps} steps: raw peak RSS {pose['peak_rss_mb']:.0f} / {full['peak_rss_mb']:.0f} MB = "
        f"{pose['peak_rss_mb'] / full['peak_rss_mb']:.2f}×; training memory (above the loop's start) "
        f"{pose['training_mb']:.0f} / {full['training_mb']:.0f} MB = {pose['training_mb'] / full['training_mb']:.2f}×"
    )


if __name__ == "__main__":
    main()
