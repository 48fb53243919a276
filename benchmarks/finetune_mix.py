"""Fine-tuning data for context extension: plain code vs the retrieval mixture vs the mixture with PoSE.

On the demo's grown model (``--model``: ``builtin:grown-code-64-mk`` since 2026-12-01, before that
``builtin:grown-code-64``, which its results page's 2026-11-30 run used; 64-token window) extended ×F, the
same number of optimizer steps and rows for every arm:

* ``yarn`` — YaRN training-free (the reference every arm is paired against);
* ``plain`` — nf4 QLoRA on plain training-split stdlib code at the target length (the demo's ``--plain``);
* ``mix`` — the demo's mixture (stdlib code + needle / multi-key tasks on training-split code + short
  blocks at the original length), at the target length;
* ``mix-pose`` — the same mixture with PoSE rows of ``--pose-factor`` × the window (positions reach the
  target; fewer tokens per row, so this arm also sees fewer tokens — reported).

Every model is evaluated on held-out stdlib files, teacher-forced (:mod:`ctxext.scoring.answers`):
``needle`` with the template it was trained on (t0, the demo's ``KEY_xy = …``) and with the held-out
template t4 (``xy_id = …``), by length and depth; ``multikey`` with 2 distractor keys at the
target (the trained form t0; the grown model retrieves no other form even inside its window, so t4
multi-key would read 0 % for every model); perplexity at the original length and at the target on the
same documents, and the unpatched base's perplexity at the original length. Paired statistics
against YaRN training-free: exact McNemar on the same trials (retrieval) and a paired bootstrap of the
NLL difference over documents (perplexity). Training time and peak memory (each run in its own process,
peak RSS) are reported per arm.

    python -m benchmarks.finetune_mix --factor 4 --seeds 0 --trials 50 --out runs/finetune_mix
    python -m benchmarks.finetune_mix --factor 8 --arms mix,mix-pose --seeds 0

Results: ``<out>/results.json`` and a Markdown table (``--md benchmarks/results/finetune_mix.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import demo_recipe, mcnemar_vs_reference

ROOT = Path(__file__).resolve().parents[1]

DEPTHS = [0, 25, 50, 75, 100]


def train_arm(arm: str, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train one arm in its own process (its peak memory is its own); return time, memory, run.json."""
    import yaml

    from ctxext.recipe.schema import dump_recipe

    run_dir = out / f"{arm}-s{seed}"
    if (run_dir / "run.json").is_file() and json.loads((run_dir / "run.json").read_text()).get("status") == "complete":
        return json.loads((run_dir / "arm.json").read_text())
    overrides = [
        f"model.path={args.model}",
        f"rope.method={args.method}",
        f"train.micro_batch_size={args.micro_batch_size}",
        f"train.learning_rate={args.lr}",
        f"lora.r={args.lora_r}",
        f"lora.alpha={2 * args.lora_r}",
        f"train.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        f"train.seed={seed}",
        "train.save_every=null",
    ]
    if arm != "plain":
        overrides.append(f"data.short_fraction={args.short_fraction}")
    recipe = demo_recipe(
        run_dir,
        overrides,
        original=args.original,
        factor=args.factor,
        steps=args.steps,
        plain=arm == "plain",
        pose_factor=args.pose_factor if arm == "mix-pose" else None,
        task_weight=args.task_weight,
        multikey_share=args.multikey_share,
    )
    recipe_file = out / f"{arm}-s{seed}.yaml"
    recipe_file.write_text(dump_recipe(recipe))
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    started = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "ctxext", "train", str(recipe_file)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"training {arm} seed {seed} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    run = json.loads((run_dir / "run.json").read_text())
    info = {
        "arm": arm,
        "seed": seed,
        "run_dir": str(run_dir),
        "seq_len": recipe.seq_len,
        "train_seconds": round(seconds, 1),
        "peak_mem_mb": max(m["peak_mem_mb"] for m in metrics),
        "tokens_seen": run["tokens_seen"],
        "final_train_loss": run["final_train_loss"],
        "final_val_loss": run["final_val_loss"],
        "recipe": yaml.safe_load(recipe_file.read_text()),
    }
    (run_dir / "arm.json").write_text(json.dumps(info, indent=2))
    return info


def evaluate(path: str, name: str, args: argparse.Namespace, docs: list[Any], hay: Any) -> dict[str, Any]:
    """Retrieval grids and per-document NLL of one model on the held-out files."""
    import torch

    from ctxext.evaluation.sections.grids.engine import GridSettings, evaluate_task_grid
    from ctxext.models.load import ModelSpec, load_model

    loaded = load_model(ModelSpec(path, name=name), device="cpu")
    if name == "base":  # the unpatched model: only its own window (the original-length ppl reference)
        return {"name": name, "doc_nll": {str(args.original): _doc_nll(loaded, docs, args.original)}}
    orig, target = args.original, args.original * args.factor
    out: dict[str, Any] = {"name": name}
    grid = GridSettings(lengths=[orig, target], depths=DEPTHS, trials=args.trials, seed=1234)
    out["needle_t0"] = evaluate_task_grid(loaded, grid, "needle", hay, template=0, show_progress=False)
    out["needle_t4"] = evaluate_task_grid(loaded, grid, "needle", hay, template=4, show_progress=False)
    far = GridSettings(lengths=[target], depths=DEPTHS, trials=args.trials, seed=4321)
    out["multikey2_t0"] = evaluate_task_grid(
        loaded, far, "multikey", hay, template=0, options={"distractors": 2}, show_progress=False
    )
    out["doc_nll"] = {str(length): _doc_nll(loaded, docs, length) for length in (orig, target)}
    del loaded
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


def _doc_nll(loaded: Any, docs: list[Any], length: int) -> list[float]:
    """Per-document NLL sums of the first ``length`` tokens (the same tokens for every model)."""
    from ctxext.scoring.nll import token_nll

    return [float(token_nll(loaded.model, ids[:length].unsqueeze(0))[0].sum()) for ids in docs]


def flat_outcomes(grid: dict[str, Any], length: int | None = None) -> list[int]:
    """The per-trial outcomes of a grid, in cell order (optionally one length)."""
    return [o for c in grid["cells"] if length is None or c["length"] == length for o in c["outcomes"]]


def _ppl_ratio(a_sums: list[float], b_sums: list[float], n: int) -> dict[str, Any]:
    """ppl(a) / ppl(b) on the same documents, with its 95 % paired-bootstrap interval."""
    import numpy as np

    from ctxext.scoring.stats import paired_ppl_ratio

    r = paired_ppl_ratio(np.array(a_sums), np.array(b_sums), np.full(len(a_sums), n, dtype=float), 2000, seed=0)
    return {"ratio": r["ratio"], "ratio_ci": [r["ci_low"], r["ci_high"]]}


def compare(
    results: dict[str, Any], ref: dict[str, Any], base: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Paired statistics of one model against the reference (YaRN training-free) and the unpatched base."""
    target = args.original * args.factor
    stats: dict[str, Any] = {}
    for key in ("needle_t0", "needle_t4", "multikey2_t0"):
        a, b = flat_outcomes(results[key], target), flat_outcomes(ref[key], target)
        stats[f"{key}@{target}"] = mcnemar_vs_reference(a, b)
    for length in (args.original, target):
        stats[f"ppl@{length}"] = _ppl_ratio(results["doc_nll"][str(length)], ref["doc_nll"][str(length)], length - 1)
    o = str(args.original)
    stats["ppl_vs_base"] = _ppl_ratio(results["doc_nll"][o], base["doc_nll"][o], args.original - 1)
    return stats


def ppl(result: dict[str, Any], length: int) -> float:
    """Token-weighted perplexity over the documents."""
    sums = result["doc_nll"][str(length)]
    return math.exp(sum(sums) / (len(sums) * (length - 1)))


def markdown(payload: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per model and seed) with the paired tests."""
    args = payload["settings"]
    orig, target = args["original"], args["original"] * args["factor"]
    lines = [
        f"### ×{args['factor']} ({orig} → {target} tokens), {args['steps']} steps × {args['micro_batch_size']} rows, "
        f"{args['trials']} trials per cell, held-out stdlib files; unpatched base ppl@{orig}: "
        f"{payload['base_ppl_original']:.2f}",
        "",
        f"| model | seed | seq_len | train s | peak MB | needle t0 @{orig} | needle t0 @{target} min-depth | "
        f"needle t0 @{target} | needle t4 (held-out) @{target} | multikey-2 t0 @{target} | ppl@{orig} | "
        f"ppl@{target} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in payload["models"]:
        r = m["eval"]

        def acc(grid: dict[str, Any], length: int) -> str:
            cell = grid["by_length"][str(length)]
            return f"{100 * cell['accuracy']:.0f}% ({100 * cell['ci_low']:.0f}–{100 * cell['ci_high']:.0f})"

        depth_acc = [c for c in r["needle_t0"]["cells"] if c["length"] == target]
        worst = min(depth_acc, key=lambda c: c["accuracy"])
        t = m.get("train") or {}
        lines.append(
            f"| {m['arm']} | {t.get('seed', '-')} | {t.get('seq_len', '-')} | {t.get('train_seconds', '-')} | "
            f"{round(t['peak_mem_mb']) if t else '-'} | {acc(r['needle_t0'], orig)} | "
            f"{100 * worst['accuracy']:.0f}% @d{worst['depth']:g} (LB {100 * worst['ci_low']:.0f}) | "
            f"{acc(r['needle_t0'], target)} | {acc(r['needle_t4'], target)} | {acc(r['multikey2_t0'], target)} | "
            f"{ppl(r, orig):.2f} | {ppl(r, target):.2f} |"
        )
    lines += ["", "Paired against YaRN training-free (McNemar exact p; ppl ratio with 95 % paired-bootstrap CI):", ""]
    lines.append(
        f"| model | seed | needle t0 @{target} | needle t4 @{target} | multikey-2 @{target} | "
        f"ppl@{orig} ratio | ppl@{target} ratio | ppl@{orig} / unpatched base's |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for m in payload["models"]:
        if "stats" not in m:
            continue
        s = m["stats"]
        mc = [s[f"{key}@{target}"] for key in ("needle_t0", "needle_t4", "multikey2_t0")]
        pr = [s[f"ppl@{length}"] for length in (orig, target)] + [s["ppl_vs_base"]]
        lines.append(
            f"| {m['arm']} | {m['train']['seed']} | "
            + " | ".join(f"+{x['only_this']}/−{x['only_reference']}, p={x['p_value']:.2g}" for x in mc)
            + " | "
            + " | ".join(f"{x['ratio']:.3f} ({x['ratio_ci'][0]:.3f}–{x['ratio_ci'][1]:.3f})" for x in pr)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from ctxext.cli.demo import RECIPE
    from ctxext.recipe.schema import load_recipe

    demo = load_recipe(RECIPE)  # every training default is the demo's, so the `mix` arm is the demo's fine-tune
    parser.add_argument("--model", default=demo.model.path, help="the base model (default: the demo's)")
    parser.add_argument("--original", type=int, default=64, help="the base's window in tokens")
    parser.add_argument(
        "--factor", type=int, default=int(demo.rope.target_length or 256) // 64, help="extend to factor × original"
    )
    parser.add_argument("--method", default=demo.rope.method, help="the RoPE method of the fine-tuned arms")
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=demo.train.gradient_checkpointing,
        help="train with activation checkpointing (saves memory, costs time)",
    )
    parser.add_argument("--arms", default="plain,mix,mix-pose", help="comma-separated: plain, mix, mix-pose")
    parser.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    parser.add_argument("--steps", type=int, default=demo.train.max_steps, help="optimizer steps per arm")
    parser.add_argument("--micro-batch-size", type=int, default=demo.train.micro_batch_size, help="rows per step")
    parser.add_argument("--lr", type=float, default=demo.train.learning_rate, help="learning rate")
    parser.add_argument("--lora-r", type=int, default=demo.lora.r, help="LoRA rank")
    parser.add_argument("--short-fraction", type=float, default=demo.data.short_fraction, help="share of short rows")
    parser.add_argument(
        "--task-weight",
        type=float,
        default=sum(s.weight for s in demo.data.mixture or [] if s.task),
        help="share of task rows in the mixture",
    )
    parser.add_argument("--multikey-share", type=float, default=0.0, help="part of the task rows that are multi-key")
    parser.add_argument("--pose-factor", type=int, default=2, help="mix-pose rows of pose-factor × the window")
    parser.add_argument("--trials", type=int, default=50, help="needle trials per (length, depth) cell")
    parser.add_argument("--docs", type=int, default=32, help="held-out documents for perplexity")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("runs/finetune_mix"), help="runs and results.json")
    parser.add_argument("--md", type=Path, default=None, help="append the Markdown table to this file")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from ctxext.models.folder import extend_folder
    from ctxext.scoring.documents import tokenize_documents
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    target = args.original * args.factor
    patched = out / f"patched-yarn-x{args.factor}"
    if not (patched / "config.json").is_file():
        extend_folder(args.model, patched, "yarn", target, overwrite=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(patched)
    docs = tokenize_documents(iter_texts("builtin:stdlib"), tok, target, args.docs).ids
    hay = Haystack.from_texts(tok, iter_texts("builtin:stdlib"), 200_000, "builtin:stdlib")
    base = evaluate(args.model, "base", args, docs, hay)
    ref = evaluate(str(patched), "yarn", args, docs, hay)
    models: list[dict[str, Any]] = [{"arm": "yarn (training-free)", "eval": ref}]
    print(f"unpatched base: ppl@{args.original} {ppl(base, args.original):.2f}", flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for arm in args.arms.split(","):
            info = train_arm(arm, seed, args, out)
            print(f"trained {arm} seed {seed}: {info['train_seconds']} s, {info['peak_mem_mb']:.0f} MB", flush=True)
            result = evaluate(info["run_dir"], arm, args, docs, hay)
            models.append({"arm": arm, "train": info, "eval": result, "stats": compare(result, ref, base, args)})
            payload = {
                "settings": {**vars(args), "out": str(args.out), "md": str(args.md)},
                "base_ppl_original": ppl(base, args.original),
                "models": models,
            }
            (out / "results.json").write_text(json.dumps(payload, indent=1, default=str))
            print(markdown(payload), flush=True)
    text = markdown(payload)
    if args.md:
        with open(args.md, "a") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
