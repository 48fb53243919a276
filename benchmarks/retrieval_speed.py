"""Retrieval grids: teacher-forced scoring vs greedy generation — same samples, same run, speed and accuracy.

For each model (static RoPE: the grown model, and the grown model with YaRN ×4 / Llama 3 ×4 patched in
memory), the same needle grid (lengths × depths × trials; samples seeded by the cell, so both scorings see
identical prompts) is scored twice:

* teacher-forced: ``evaluate_task_grid(..., scoring="teacher-forced")`` — one forward pass over prompt +
  answer per batch of equal-length samples, the final decoder layer and the logits only at the answer
  positions;
* generation: ``scoring="generate"`` — greedy decoding (KV cache on: static RoPE), correct iff the
  generated tokens start with the answer's; run twice: generating just the answer's tokens with every
  sample of a length batched (the cheapest a generation harness can be), and as the previous grids ran
  (12 tokens, one batch per (length, depth) cell).

Teacher-forced scoring is exact for greedy decoding, so the two must agree trial by trial; the benchmark
checks that and prints the speed ratio (process CPU time; wall time is shown too). Runs alternate
(teacher-forced, generation, teacher-forced, generation, …) and the least time of ``--repeats`` counts.

A second table splits the teacher-forced grid's time: building the samples (tokenising needle, question
and answer per trial; the haystack is tokenised once) and scoring them with the final layer at the answer
positions only or in full (``score_answers(..., answer_only=False)``, the previous scorer), on the same
samples, with the scores compared.

    nice -n 5 python -m benchmarks.retrieval_speed      # writes benchmarks/results/retrieval_speed.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchmarks._common import measured_on

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "retrieval_speed.md"
NEEDLE = {"needle": "\nKEY_{name} = {key}\n", "question": "\nassert KEY_{name} ==", "answer": "{key}"}


def _load(method: str | None):
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.rope.read import read_rope
    from ctxext.rope.runtime import patch_model

    lm = load_model(ModelSpec("builtin:grown-code-64"), device="cpu")
    if method:
        patch_model(lm.model, method, 256)
        lm.rope = read_rope(lm.model.config)
        lm.name = f"{method} x4"
    else:
        lm.name = "base"
    return lm


def _run(lm, grid, task, hay, scoring: str, new_tokens: int, per_cell: bool, batch_tokens: int | None):
    from dataclasses import replace

    from ctxext.evaluation.sections.grids.engine import evaluate_task_grid

    settings = replace(grid, scoring=scoring, max_new_tokens=new_tokens, batch_tokens=batch_tokens)
    cpu, wall = time.process_time(), time.perf_counter()
    if per_cell:
        # One call per depth: batches hold one (length, depth) cell, as the previous grids did.
        parts = [
            evaluate_task_grid(lm, replace(settings, depths=[d]), "needle", hay, task.to_template(), None, False)
            for d in grid.depths
        ]
        cells = sorted(
            (c for p in parts for c in p["cells"]), key=lambda c: (c["length"], grid.depths.index(c["depth"]))
        )
        res = {"cells": cells, "overall": {"correct": sum(c["correct"] for c in cells)}}
    else:
        res = evaluate_task_grid(lm, settings, "needle", hay, task.to_template(), None, False)
    return time.process_time() - cpu, time.perf_counter() - wall, res


def _profile(lm, grid, task, hay, repeats: int) -> dict[str, float | bool]:
    """Least CPU seconds of building the grid's samples and of scoring them (answer-only / full final layer)."""
    from ctxext.scoring.answers import score_answers
    from ctxext.tasks.samples import make_samples

    variants = {"previous": (False, 32768), "full": (False, None), "answer-only": (True, None)}
    best = {"build": 1e9, **dict.fromkeys(variants, 1e9)}
    scores = {}
    for _ in range(repeats):
        cpu = time.process_time()
        samples = [
            s
            for L in grid.lengths
            for d in grid.depths
            for s in make_samples(lm.tokenizer, "needle", hay, L, d, trials=grid.trials, seed=grid.seed, template=task)
        ]
        best["build"] = min(best["build"], time.process_time() - cpu)
        seqs, spans = [s.ids for s in samples], [s.answer_span for s in samples]
        for label, (answer_only, batch) in variants.items():
            cpu = time.process_time()
            scores[label] = score_answers(lm.model, seqs, spans, batch_tokens=batch, answer_only=answer_only)
            best[label] = min(best[label], time.process_time() - cpu)
    a = scores["answer-only"]
    same = all([x.correct for x in a] == [x.correct for x in scores[k]] for k in variants)
    nll = max(abs(x.nll - y.nll) for k in variants for x, y in zip(a, scores[k], strict=True))
    return {**best, "same": same, "nll_diff": nll}


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,yarn,llama3", help="none = the base model; static RoPE only")
    parser.add_argument("--lengths", default="64,128,256")
    parser.add_argument("--depths", default="0,25,50,75,100")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--long-new-tokens", type=int, default=12, help="the second generation run's tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)

    import torch

    from ctxext.evaluation.sections.grids.engine import GridSettings, NeedleTask, load_haystack
    from ctxext.rope.scaling_types import LENGTH_DEPENDENT_TYPES

    torch.set_num_threads(args.threads)
    grid = GridSettings(
        lengths=[int(x) for x in args.lengths.split(",")],
        depths=[float(x) for x in args.depths.split(",")],
        trials=args.trials,
        allow_beyond_context=True,
    )
    task = NeedleTask(**NEEDLE)
    # (scoring, new tokens, one call per depth, tokens per batch). Teacher-forced: the device default
    # (2048 on the CPU). (a) runs at two batch sizes and counts the faster, so no batch choice handicaps it;
    # (b) at the previous grids' 32768 (the trials of a cell in one batch).
    runs = {
        "teacher-forced": ("teacher-forced", 1, False, None),
        "generate (answer)": ("generate", 1, False, 32768),
        "generate (answer, small batches)": ("generate", 1, False, 2048),
        "generate (previous)": ("generate", args.long_new_tokens, True, 32768),
    }
    rows, checks, prof_rows = [], [], []
    totals = {"teacher-forced": 0.0, "a": 0.0, "b": 0.0}
    for method in args.methods.split(","):
        lm = _load(None if method == "none" else method)
        if lm.rope.rope_type in LENGTH_DEPENDENT_TYPES:
            sys.exit(f"{method}: length-dependent RoPE; this benchmark compares on static RoPE only")
        hay = load_haystack(lm, "builtin:stdlib", "text", "test", 2 * max(grid.lengths))
        best = dict.fromkeys(runs, (1e9, 1e9, None))
        for _ in range(args.repeats):
            for label, (scoring, new, per_cell, batch) in runs.items():
                cpu, wall, res = _run(lm, grid, task, hay, scoring, new, per_cell, batch)
                if cpu < best[label][0]:
                    best[label] = (cpu, wall, res)
        tf_cpu, tf_wall, tf = best["teacher-forced"]
        n = tf["overall"]["trials"]
        for label in runs:
            checks.append([c["outcomes"] for c in tf["cells"]] == [c["outcomes"] for c in best[label][2]["cells"]])
        # (a): the faster of its two batch sizes.
        a_label = min(("generate (answer)", "generate (answer, small batches)"), key=lambda k: best[k][0])
        picked = {"teacher-forced": "teacher-forced", "a": a_label, "b": "generate (previous)"}
        cells = [f"{lm.name}", str(n), f"{tf['overall']['correct']}/{n}", f"{tf_cpu:.2f} ({tf_wall:.2f})"]
        for key in ("a", "b"):
            cpu, wall, res = best[picked[key]]
            same = [c["outcomes"] for c in tf["cells"]] == [c["outcomes"] for c in res["cells"]]
            batch = f", {runs[picked[key]][3]} tok/batch" if key == "a" else ""
            cells += [
                f"{res['overall']['correct']}/{n} ({'identical' if same else '**DIFFERENT**'})",
                f"{cpu:.2f} ({wall:.2f}{batch})",
                f"**{cpu / tf_cpu:.1f}×**",
            ]
        for key, label in picked.items():
            totals[key] += best[label][0]
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
        prof = _profile(lm, grid, task.to_template(), hay, args.repeats)
        checks.append(bool(prof["same"]))
        prof_rows.append(
            f"| {lm.name} | {prof['build']:.2f} | {prof['previous']:.2f} | {prof['full']:.2f} | "
            f"{prof['answer-only']:.2f} | **{prof['previous'] / prof['answer-only']:.2f}×** | "
            f"{'yes' if prof['same'] else '**NO**'} (max NLL difference {prof['nll_diff']:.1e}) |"
        )
        print(prof_rows[-1], flush=True)
    ratio = totals["a"] / totals["teacher-forced"]
    ratio_long = totals["b"] / totals["teacher-forced"]
    verdict = (
        "met"
        if min(ratio, ratio_long) >= 3
        else "met against the previous grids only"
        if ratio_long >= 3
        else "NOT met"
    )
    cmd = "python -m benchmarks.retrieval_speed" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    lines = [
        "# Retrieval grids: teacher-forced scoring vs greedy generation",
        "",
        f"Command: `{cmd}`",
        "",
        measured_on(),
        "",
        f"torch {torch.__version__}, {args.threads} thread(s), CPU fp32, SDPA, on a shared 2-core machine "
        f"({os.cpu_count()} CPUs visible). Model: `builtin:grown-code-64` (64-token window), RoPE patched to "
        f"×4 in memory. Needle grid: in-domain key `{NEEDLE['needle']!r}` / `{NEEDLE['question']!r}`, held-out "
        f"stdlib haystack; lengths {grid.lengths} (prompt + answer), depths {grid.depths} %, {grid.trials} trials "
        f"per cell, the same seeded samples for every scoring. Teacher-forced: the scorer's CPU default of 2048 "
        f"tokens per forward pass (sequences of one length stacked), final layer at the answer positions only. "
        f"Generation decodes greedily with the KV cache: (a) just the answer's tokens, the samples of a length "
        f"batched, run at 32768 and at 2048 tokens per batch, the faster counted; (b) as the previous grids ran: "
        f"{args.long_new_tokens} tokens, one batch per (length, depth) cell. Times: process CPU seconds (wall in "
        f"parentheses), least of {args.repeats} alternating runs.",
        "",
        "| model | trials | teacher-forced correct | teacher-forced CPU s | generation (a) correct | CPU s "
        "| speed-up | generation (b, previous grids) correct | CPU s | speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"* **speed-up over all models: {ratio:.1f}×** against (a), **{ratio_long:.1f}×** against (b), the "
        "previous grids (generation CPU time / teacher-forced CPU time); "
        f"target ≥ 3×: {verdict}.",
        f"* accuracy identical trial by trial: {'yes, for every model and run' if all(checks) else '**NO**'} "
        '(teacher-forced correctness is exactly "greedy decoding starts with the answer\'s tokens").',
        "* baseline (b) is what the grids did before teacher-forced scoring (`git show d273cec^:ctxext/evaluation/"
        "passkey.py`): greedy `generate` of 12 new tokens (keyed needles: max(12, answer tokens + 8) = 12 here), "
        "the trials of one (length, depth) cell in one batch, KV cache on; (a) is the cheapest generation "
        "harness (only the answer's tokens, the samples of a length batched, its faster batch size).",
        "",
        "Where the teacher-forced grid's time goes (least CPU seconds of "
        f"{args.repeats} runs; the same samples; scoring = `score_answers`, whose forward pass is all of it "
        "but the vocabulary projection of the few answer positions):",
        "",
        "| model | building the samples | scoring as before (full final layer, 32768 tok/pass) | full final "
        "layer, 2048 tok/pass | final layer at answer positions, 2048 tok/pass (now) | scoring speed-up | "
        "same scores |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *prof_rows,
        "",
        "* what made it faster (profiled with cProfile: the forward pass is ~97 % of the grid, linear layers "
        "over half of it, building the samples ~3 %): smaller batches (the activations stay in cache) and the "
        "final layer only where answers are predicted (its keys and values everywhere; its queries, attention, "
        "MLP and norm at the last few positions). Every outcome stays the same; answer NLLs move by float "
        "rounding only (another batch composition sums in another order: the NLL difference column).",
        "* why the ratio stays bounded here: a teacher-forced pass costs what generation's prefill costs but "
        "for that final layer; every other layer must run at every position for either scoring. On this CPU "
        "with a "
        "4.2M-parameter model a pass is compute-bound, so the prefill dominates generation and the cached "
        "decode steps are cheap: against generating just the answer (a) the saving is the final layer and "
        "the decode steps; against the previous grids (b) also 11 more decode steps and smaller batches. "
        "Where decode steps are latency-bound (a GPU) the number of passes would decide instead — not "
        "measured here (no GPU in this environment).",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"speed-up {ratio:.2f}x / {ratio_long:.2f}x, identical: {all(checks)}; wrote {args.out}")
    if not all(checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
