"""Train one sweep arm: the demo's fine-tune recipe with overrides; prints CPU seconds and peak RSS.

    python -m experiments.mix_sweep.arm NAME '{"steps": 240, "rope": {"method": "llama3"}}'
    THREADS=2 python -m experiments.mix_sweep.arm NAME '{...}'    # or --threads 2

Overrides: ``steps``, ``lr``, ``r``, ``short``, ``tasks``, ``multikey``, ``factor``, ``pose``, ``pose_factor``,
``original`` (the base's window, default 64) (the arm's knobs over the demo's recipe file,
:func:`benchmarks._common.demo_recipe`) and any recipe section (deep-merged into the recipe). The run goes to
``runs/sweep/NAME``; ``--threads`` (or ``THREADS``) sets the training's thread count (default 1). ``cpu_s`` is
the training process's user + system CPU time (data preparation and loading included): on a quiet machine that
is the single-core wall time, the honest measure on a shared one.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def deep_merge(a: dict, b: dict) -> None:
    """Merge ``b`` into ``a`` (nested dicts merged, everything else replaced)."""
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            deep_merge(a[k], v)
        else:
            a[k] = v


def json_object(text: str) -> dict:
    """The overrides argument: a JSON object, or an argparse error that says what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return value


# The arm's knobs that are one recipe key each.
KNOBS = {"lr": "train.learning_rate", "short": "data.short_fraction"}


def main(argv: list[str] | None = None) -> None:
    """Parse the arm's name and overrides, write its recipe, train it, print one JSON line."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="the arm's name: the run goes to runs/sweep/NAME, its recipe to NAME.yaml")
    parser.add_argument("overrides", type=json_object, help="a JSON object of knobs and recipe sections")
    parser.add_argument(
        "--threads", type=int, default=os.environ.get("THREADS", "1"), help="training threads (env THREADS)"
    )
    args = parser.parse_args(argv)
    import yaml

    from benchmarks._common import demo_recipe
    from ctxext.recipe.schema import dump_recipe

    name, ov = args.name, dict(args.overrides)
    factor = ov.pop("factor", 4)
    pose = ov.pop("pose", False)
    pose_factor = ov.pop("pose_factor", 2)
    given = [f"{key}={ov.pop(knob)}" for knob, key in KNOBS.items() if knob in ov]
    if "r" in ov:
        given += [f"lora.r={ov['r']}", f"lora.alpha={2 * ov.pop('r')}"]
    run = ROOT / "runs" / "sweep" / name
    recipe = demo_recipe(
        run,
        given,
        original=ov.pop("original", 64),
        factor=factor,
        steps=ov.pop("steps", None),
        pose_factor=pose_factor if pose else None,
        task_weight=ov.pop("tasks", None),
        multikey_share=ov.pop("multikey", 0.0),
    )
    recipe = yaml.safe_load(dump_recipe(recipe))
    deep_merge(recipe, ov)
    recipe["train"]["save_every"] = None
    file = run.parent / f"{name}.yaml"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump(recipe))
    if run.exists():
        shutil.rmtree(run)
    started = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run([sys.executable, "-m", "ctxext", "train", str(file)], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stdout[-2000:] + proc.stderr[-3000:])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    print(
        json.dumps(
            {
                "arm": name,
                "wall_s": round(time.time() - started),
                "cpu_s": round(usage.ru_utime + usage.ru_stime),
                "peak_mb": max(m["peak_mem_mb"] for m in metrics),
                "loss": metrics[-1].get("loss"),
            }
        )
    )


if __name__ == "__main__":
    main()
