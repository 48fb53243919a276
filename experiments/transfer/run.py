"""Fine-tune a base with the default recipe over several seeds, then evaluate every seed on fresh prompts.

    python -m experiments.transfer.run builtin:grown-code-64                 # 3 seeds, 100 trials per cell
    python -m experiments.transfer.run builtin:grown-neox-64 --arm pose --set train.seq_len=2x train.pose.chunks=2
    python -m experiments.transfer.read runs/transfer/grown-code-64          # the reading (experiments.transfer.read)

Per seed ``S``: ``ctxext train recipes/default.yaml model.path=BASE train.seed=S`` (the default recipe, its lengths
multiples of the base's window; ``--set`` overrides make another arm), resumed where a run stopped. Once per base:
the ``llama3`` training-free start (``ctxext extend``) at the recipe's target. Then, per seed, teacher-forced needle
retrieval (form 0, the demo's: the only key form the grown bases retrieve in their window, so the only one the
relative target can be read on; the recipe trains on it too, with other names, keys and documents) at depths
0/25/50/75/100 % inside the window (the base, the start, the arm) and at the target (the start, the arm),
``--trials`` per cell, on prompts seeded by the training seed: each seed's prompts are fresh, and every model of one
seed sees the same ones (paired). And the per-document NLL of 32 held-out documents' first window of tokens (the
in-window perplexity against the base). One JSON file per (model, seed) in ``WORK/NAME``; a rerun skips what is
there. Training runs as ``ctxext train`` does (its calibration, by its rule). ``experiments.transfer.forms``
measures the other forms.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "default.yaml"
DEPTHS = [0, 25, 50, 75, 100]
DOCUMENTS = 32
# Each training seed's prompts: far apart, so no two seeds share a trial.
PROMPT_SEED = 1234
PROMPT_STRIDE = 7919


def prompt_seed(seed: int) -> int:
    """The needle trials' seed for a training seed (the same for every model of that seed)."""
    return PROMPT_SEED + PROMPT_STRIDE * seed


def base_name(base: str) -> str:
    """A folder name for a base (``builtin:grown-code-64`` → ``grown-code-64``)."""
    return base.split(":", 1)[-1].rstrip("/").replace("/", "-")


def _ctxext(args: list[str], log: Path) -> float:
    started = time.time()
    with log.open("a") as fh:
        fh.write(f"$ ctxext {' '.join(args)}\n")
        fh.flush()
        done = subprocess.run([sys.executable, "-m", "ctxext", *args], stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        sys.exit(f"ctxext {args[0]} failed (exit {done.returncode}); see {log}")
    return time.time() - started


def _complete(run_dir: Path) -> bool:
    record = run_dir / "run.json"
    return record.is_file() and json.loads(record.read_text()).get("status") == "complete"


def train_seed(base: str, arm: str, sets: list[str], seed: int, folder: Path) -> Path:
    """The arm's fine-tune for one seed (trained, or resumed, unless complete)."""
    run_dir = folder / f"{arm}-s{seed}"
    if not _complete(run_dir):
        cmd = ["train", str(RECIPE), f"model.path={base}", f"train.seed={seed}", f"output.dir={run_dir}", *sets]
        resumed = (run_dir / "run.json").is_file()
        print(f"{arm} seed {seed}: training ({'resumed' if resumed else 'new'}) → {run_dir}", flush=True)
        seconds = _ctxext([*cmd, "--resume"] if resumed else cmd, folder / "commands.log")
        print(f"{arm} seed {seed}: trained in {seconds:.0f} s", flush=True)
    return run_dir


def shared_start(base: str, target: int, start: Path, log: Path, poll: float = 5.0, patience: float = 600.0) -> None:
    """The ``llama3`` start every seed of a base shares, built once.

    Two runs of one base started together (one seed each, side by side) would both build it; the second ``ctxext
    extend`` is refused by the folder's lock. So a run that finds the lock held by a live writer waits for its
    folder, at most ``patience`` seconds (building it takes seconds); with no live writer (or once its patience is
    spent) it extends itself, which clears a stale lock or names the writer still running.
    """
    from ctxext.artifacts.lock import held

    deadline = time.time() + patience
    waiting = False
    while not (start / "config.json").is_file():
        if not held(start) or time.time() > deadline:
            _ctxext(["extend", base, "--method", "llama3", "--target-length", str(target), "--out", str(start)], log)
            return
        if not waiting:
            print(f"waiting for another run to write {start}", flush=True)
            waiting = True
        time.sleep(poll)


def needle_outcomes(
    loaded: Any, lengths: list[int], seed: int, trials: int, hay: Any, form: int = 0
) -> dict[str, list[int]]:
    """Per ``"length/depth"`` cell, the trials' outcomes (1 correct), on the seed's prompts, in key form ``form``."""
    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid

    grid = GridSettings(lengths=lengths, depths=DEPTHS, trials=trials, seed=prompt_seed(seed))
    g = evaluate_task_grid(loaded, grid, "needle", hay, template=form, show_progress=False)
    return {f"{c['length']}/{round(c['depth'])}": [int(o) for o in c["outcomes"]] for c in g["cells"]}


def evaluate(models: dict[str, tuple[str, list[int]]], seed: int, trials: int, window: int, folder: Path) -> None:
    """Each model's outcomes and document NLL for one seed, into ``eval-MODEL-sSEED.json`` (skipped if there)."""
    import torch
    from transformers import AutoTokenizer

    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack
    from experiments.mix_sweep._probe import document_nll, stdlib_documents

    todo = {m: v for m, v in models.items() if not (folder / f"eval-{m}-s{seed}.json").is_file()}
    if not todo:
        return
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "llama3"))
    hay = Haystack.from_texts(tokenizer, iter_texts("builtin:stdlib"), 200_000, "builtin:stdlib")
    docs = stdlib_documents(tokenizer, window, DOCUMENTS)
    for name, (ref, lengths) in todo.items():
        started = time.time()
        loaded = load_model(ModelSpec(ref, name=name), device="cpu")
        with torch.no_grad():
            nll = [float(x) for x in document_nll(loaded.model, docs, window).sum(dim=1)]
        result = {
            "model": name,
            "ref": ref,
            "seed": seed,
            "prompt_seed": prompt_seed(seed),
            "window": window,
            "trials": trials,
            "needle": needle_outcomes(loaded, lengths, seed, trials, hay),
            "doc_nll": nll,
            "tokens_per_doc": window - 1,
            "attention_temperature": loaded.attention_temperature,
            "seconds": 0.0,
        }
        result["seconds"] = round(time.time() - started, 1)
        out = folder / f"eval-{name}-s{seed}.json"
        out.with_suffix(".tmp").write_text(json.dumps(result) + "\n")
        out.with_suffix(".tmp").replace(out)
        cells = result["needle"]
        summary = " · ".join(f"{k} {100 * sum(v) / len(v):.0f}" for k, v in cells.items())
        print(f"  {name} seed {seed} ({result['seconds']:.0f} s): {summary}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Train the arm's seeds, build the start, evaluate everything not yet evaluated."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", help="the base: a built-in name, a folder or a GGUF file")
    parser.add_argument("--arm", default="default", help="the arm's name (default: the recipe unchanged)")
    parser.add_argument("--set", dest="sets", nargs="*", default=[], help="recipe key=value overrides of the arm")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    parser.add_argument("--trials", type=int, default=100, help="needle trials per (length, depth) cell and seed")
    parser.add_argument("--work", default="runs/transfer", help="the results' parent folder")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of the evaluation")
    args = parser.parse_args(argv)
    if args.arm in ("base", "llama3") or not args.arm.replace("-", "").replace("_", "").isalnum():
        parser.error(f"--arm {args.arm!r}: use letters, digits, '-' or '_', and not 'base' or 'llama3'")
    import torch

    from ctxext.recipe.schema import load_recipe

    torch.set_num_threads(args.threads)
    folder = Path(args.work) / base_name(args.base)
    folder.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(RECIPE, [f"model.path={args.base}", *args.sets])
    target = int(recipe.rope.target_length or 0)
    from ctxext.recipe.window import model_window

    window = model_window({"model": {"path": args.base}})
    arm_file = folder / f"{args.arm}.json"
    arm_file.write_text(json.dumps({"arm": args.arm, "sets": args.sets, "target": target, "window": window}) + "\n")
    start = folder / "llama3"
    shared_start(args.base, target, start, folder / "commands.log")
    print(f"{args.base}: window {window}, target {target}; arm {args.arm} {' '.join(args.sets)}", flush=True)
    for seed in args.seeds:
        run_dir = train_seed(args.base, args.arm, args.sets, seed, folder)
        models = {
            "base": (args.base, [window]),
            "llama3": (str(start), [window, target]),
            args.arm: (str(run_dir), [window, target]),
        }
        evaluate(models, seed, args.trials, window, folder)
    print(f"done: python -m experiments.transfer.read {folder}", flush=True)


if __name__ == "__main__":
    main()
