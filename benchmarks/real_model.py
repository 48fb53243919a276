"""The real checkpoint's journey: SmolLM2-135M-Instruct extended from its 8k window to 32k tokens (4×).

Variants: the base unpatched at 8k, 16k and 32k; linear, dynamic NTK, YaRN and llama3 extended training-free to
16k and to 32k; LongRoPE factors searched at 16k; the default recipe's nf4 QLoRA fine-tune to 32k (PoSE rows of
at most 4k tokens whose positions cover 32k), before and after ``ctxext calibrate``.

Every measurement rides on long inputs built from real long documents, the Vim reference manuals (English prose
with cross-references between distant sections, 170–420 KB each: long-range text that is not generated). An
input is one manual's first tokens, truncated to the length, with ``--keys`` needles hidden at depths 0–100 %
and a question and answer per needle after it (:mod:`ctxext.tasks.keyset`). One forward pass gives:

* perplexity by position of the manual's own tokens (the needles and the questions left out), and
* every needle's teacher-forced retrieval: correct iff greedy decoding writes the key.

The needles of an input have distinct names: RULER's multi-key needle task, every key asked. ``--only tasks``
probes which tasks beyond the needle the base can do inside its window at all (2,048 tokens, a few samples each):
none of those tried does measurably better than guessing, so the key-value lookup (a JSON-like object of random
keys) was measured on the training-free variants only. All variants see the same inputs (paired).
Intervals are 95 %: perplexity bootstrapped over documents, retrieval by a cluster bootstrap over inputs (the keys
of one input share it), next to each cell's n.

A forward pass of this model at 32k takes ~6 minutes on two quiet cores: the run is sized to a few hours, says
its estimate before it starts, writes each cell to ``real_model.json`` as it completes, and a rerun skips the
cells that are done. Run it alone on the machine::

    python -m benchmarks.real_model --estimate                 # the plan and its time, nothing run
    nice -n 5 python -m benchmarks.real_model                  # run (resumable)
    python -m benchmarks.real_model --render-only              # the page from the stored cells
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE = "builtin:smollm2-135m-instruct"
# Needles in the held-out form (`{name}_id = key`, never trained on), four per input: measured at 2,048 tokens
# with its chat template, this base retrieves 6/6 keys with two needles per input, 11/18 with six; the prose form
# (RULER's) 2/6 and 9/18. Fewer needles per forward keep the task inside what the base can do in its window.
TEMPLATE = 4
DEPTH_BANDS = 5
ORIGINAL = 8192
TARGET = 32768
METHODS = ("linear", "dynamic", "yarn", "llama3")
DOCS_DIR = Path("/usr/share/vim/vim90/doc")
# Single long manuals (each longer than 32k tokens of this tokenizer), in the order inputs take them.
DOCS = ("builtin.txt", "options.txt", "syntax.txt", "eval.txt", "pi_netrw.txt")
RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/smollm2-32k.yaml"  # the fine-tune's, relative to the repository
# The second fine-tune: ctxext's default recipe (the demo's, one file for any base) with only what this CPU's scale
# needs. Rows of 4,096 PoSE tokens (the default trains rows of the target length: 32,768 here, ~9 min per forward
# on this CPU), 4 of them per step for 30 steps as the journey's own fine-tune, so both see the same tokens; no
# adaptive probe (a probe at 32,768 tokens costs more than the steps it watches here: recipes/smollm2-32k.yaml);
# needle rows from 1,024 tokens (the default's `1x`, 8,192, is longer than a 4,096-token row); 3 warm-up steps of
# 30 (the default's 12 are for runs of hundreds of steps); a checkpoint every 5 steps and held-out loss every 10.
# Needles placed uniformly (docs/training.md, "Needle distances"): with PoSE rows a `packed` needle sits within the
# row's first 4,096 positions, never deeper, where the evaluation puts them up to 32,768; the docs advise `uniform`
# with PoSE on a Llama-like base (grown-code-64, 3 seeds: +20/-8 at the target), and the journey's recipe has it.
# Gradient checkpointing on: the step plans 16.3 GiB without it (9.3 with), too close to this shared machine's RAM.
DEFAULT_RECIPE = "recipes/default.yaml"
DEFAULT_AT_CPU_SCALE = (
    "train.seq_len=4096", "train.pose.chunks=2", "train.micro_batch_size=1", "train.gradient_accumulation_steps=4",
    "train.max_steps=30", "train.warmup_steps=3", "train.probe=null", "data.mixture.1.min_length=1024",
    "train.save_every=5", "train.eval_every=10", "data.task_position=uniform", "train.gradient_checkpointing=true",
)  # fmt: skip
# The variants that train (calibrated: the `finetuned` run after `ctxext calibrate`) and the stage each one's
# training time is stored under.
TRAINED = {"finetuned": "train", "finetuned-default": "train-default", "calibrated": "train"}
JSON_FILE = RESULTS / "real_model.json"
PAGE = RESULTS / "real_model.md"
BUCKETS = 8
# Inputs per length: a forward at 32k costs ~11 of one at 8k.
INPUTS = {8192: 5, 16384: 4, 32768: 3}
KV_INPUTS = {8192: 2, 32768: 1}
MID = TARGET // 2  # the middle length: variants extended to it, and the LongRoPE search's target
# Tasks beyond the needle, probed inside the base's window: the key-value rows need a task this model can do there
# (json_kv is not one: 11 of 120 lookups at 2,048 tokens over five templates, with and without the chat template).
# A spec is a task name and its options (``json_kv:hex=8``): the defaults, and the easier forms a small model may
# manage (shorter values to copy, fewer distractors).
PROBE_TASKS = (
    "json_kv", "json_kv:hex=8", "multikey", "icl", "variable_tracking", "doc_qa", "doc_qa:docs=2", "copy_span",
)  # fmt: skip
PROBE_LENGTH = 2048
DEVICE = "cpu"


@dataclass(frozen=True)
class Cell:
    """One measurement: a variant at a length, ``kind`` ``keys`` (perplexity + retrieval) or ``kv`` (lookup)."""

    variant: str
    length: int
    kind: str = "keys"

    @property
    def key(self) -> str:
        """The cell's name in the results file."""
        return f"{self.variant}@{self.length}:{self.kind}"

    def forwards(self) -> int:
        """Forward passes the cell runs."""
        return (KV_INPUTS if self.kind == "kv" else INPUTS)[self.length]


def variants() -> dict[str, int | None]:
    """Every variant and the target length it is extended to (``None``: the base)."""
    out: dict[str, int | None] = {"base": None}
    for method in METHODS:
        for target in (MID, TARGET):
            out[f"{method}-{target // 1024}k"] = target
    out[f"longrope-{MID // 1024}k"] = MID
    out["finetuned"] = TARGET
    out["finetuned-default"] = TARGET
    if DEVICE != "cpu":
        # `ctxext calibrate` at the target with trials that could detect a temperature's effect costs far more than
        # the fine-tune on a CPU (`ctxext train` says its estimate when it skips the calibration): the GPU check's.
        out["calibrated"] = TARGET
    return out


def plan_cells() -> list[Cell]:
    """The table's cells, cheapest first within each variant."""
    cells = [Cell("base", L) for L in (ORIGINAL, MID, TARGET)] + [Cell("base", ORIGINAL, "kv")]
    for name, target in variants().items():
        if target is None:
            continue
        # In-window cost (the variant inside the base's window), then the variant's own target.
        inside = [] if name.startswith("dynamic") else [Cell(name, ORIGINAL)]
        if name in TRAINED:
            # The half-way length first: its paired test costs a third of the target's.
            cells += [*inside, Cell(name, MID), Cell(name, target)]
            continue
        cells += inside + [Cell(name, target)]
        if name == f"yarn-{TARGET // 1024}k":
            # Measured (with the base's in-window cell) before the in-window task probe showed that this model
            # cannot do the lookup even inside its window (0/8 at 2,048 tokens): kept on the page as measured, run on
            # no other variant (a 32k forward for a task the model cannot do measures nothing).
            cells.append(Cell(name, TARGET, "kv"))
    return cells


# ---------------------------------------------------------------------------------------------------------------
# Inputs (one set for every variant)
# ---------------------------------------------------------------------------------------------------------------


def build_inputs(tokenizer: Any, length: int, kind: str, keys: int, seed: int) -> list[Any]:
    """The key sets of one length (the same for every variant: seeded by the length and the input)."""
    from ctxext.evaluation.settings import decide_chat
    from ctxext.tasks import Haystack
    from ctxext.tasks.chat import chat_wrap
    from ctxext.tasks.keyset import make_json_keyset, make_keyset, spread_depths

    # What `ctxext eval` does by default (--chat-template auto): this instruct model gets its chat template, each
    # question in a user turn and its answer prefix opening the assistant turn.
    chat = chat_wrap(tokenizer, decided=decide_chat(BASE))
    out = []
    if kind == "kv":
        hay = Haystack.from_texts(tokenizer, [(DOCS_DIR / DOCS[0]).read_text(errors="replace")], 4096)
        for i in range(KV_INPUTS[length]):
            rng = random.Random(f"{seed}-kv-{length}-{i}")
            depths = [d / 10 for d in range(11)]
            out.append(make_json_keyset(tokenizer, hay, length, depths, rng, template=0, chat=chat))
        return out
    for i in range(INPUTS[length]):
        # More inputs than manuals (--scale): the next stretch of each manual, from its beginning on.
        lap = i // len(DOCS)
        text = (DOCS_DIR / DOCS[i % len(DOCS)]).read_text(errors="replace")
        hay = Haystack.from_texts(tokenizer, [text], length * (lap + 1))
        rng = random.Random(f"{seed}-keys-{length}-{i}")
        depths = spread_depths(keys, i, INPUTS[length])
        # The needle form no training row uses, the manual's text in order: the truncated-document protocol.
        ks = make_keyset(tokenizer, hay, length, depths, rng, template=TEMPLATE, offset=lap * length, chat=chat)
        out.append(ks)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------


def measure(model: Any, inputs: list[Any], length: int, kind: str) -> dict[str, Any]:
    """One pass per input: the document's NLL by position bucket and every answer's outcome."""
    import torch

    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.scoring.nll import token_scores

    per_input = []
    for ks in inputs:
        reset_dynamic_rope(model)
        started = time.time()
        with torch.no_grad():
            nll, hits = token_scores(model, torch.tensor([ks.ids]))
        nll, hits = nll[0].double(), hits[0]
        outcomes = [bool(hits[s - 1 : e - 1].all()) for s, e in ks.spans]
        entry: dict[str, Any] = {
            "correct": outcomes,
            "depths": ks.depths,
            "seconds": round(time.time() - started, 1),
        }
        if kind == "keys":
            keep = torch.zeros(len(ks.ids), dtype=torch.bool)
            keep[ks.filler[0] + 1 : ks.filler[1]] = True
            for s, e in ks.needle_spans:
                keep[s : e + 1] = False  # the needle and the token right after it are not the manual's text
            size = length // BUCKETS
            sums, counts = [], []
            for b in range(BUCKETS):
                mask = keep[b * size : (b + 1) * size]
                # Token t is index t − 1 of the scores (it is predicted from position t − 1).
                idx = torch.arange(b * size, (b + 1) * size)[mask]
                idx = idx[idx >= 1] - 1
                sums.append(float(nll[idx].sum()))
                counts.append(int(len(idx)))
            entry.update({"nll_sums": sums, "counts": counts})
        per_input.append(entry)
        print(f"    input {len(per_input)}/{len(inputs)}: {sum(outcomes)}/{len(outcomes)} keys, {entry['seconds']} s")
    reset_dynamic_rope(model)
    return {"inputs": per_input}


# ---------------------------------------------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------------------------------------------


def _ctxext(args: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run a ``ctxext`` command (its output into ``log``); its wall time. Exit on failure with the log named."""
    started = time.time()
    with log.open("a") as fh:
        fh.write(f"$ ctxext {' '.join(args)}\n")
        fh.flush()
        cmd = [sys.executable, "-m", "ctxext", *args]
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if done.returncode:
        sys.exit(f"ctxext {args[0]} failed (exit {done.returncode}); see {log}")
    return time.time() - started


def prepare(name: str, work: Path, store: dict[str, Any], opts: argparse.Namespace) -> Any:
    """The variant's model reference (a folder or a run), built (and timed, into the store) if needed."""
    from ctxext.models.sources import resolve_model_path

    target = variants()[name]
    stages = store.setdefault("stages", {})
    if target is None:
        if "conversion" not in stages and not opts.estimate:
            # Timed in an empty cache: the conversion a user's first command pays (ours is usually cached already).
            with tempfile.TemporaryDirectory() as cache:
                seconds = _ctxext(["inspect", BASE], work / "commands.log", {"CTXEXT_CACHE": cache})
            stages["conversion"] = {"seconds": round(seconds, 1), "command": f"ctxext inspect {BASE} (empty cache)"}
            _save(store)
        return str(resolve_model_path(BASE))
    out = work / name
    log = work / "commands.log"
    if name.startswith("longrope"):
        cmd = [
            "search", BASE, "--target-length", str(target), "--out", str(out), "--budget", opts.search_budget,
            "--samples", "2", "--population", "6", "--generations", "1", "--attention-factor", "1",
            "--window-docs", "8", "--no-report",
        ]  # fmt: skip
    elif name in TRAINED:
        out = work / ("finetuned" if name == "calibrated" else name)
        recipe, extra = (
            (DEFAULT_RECIPE, DEFAULT_AT_CPU_SCALE)
            if name == "finetuned-default"
            else (opts.recipe, opts.train_override)
        )
        cmd = [
            "train", recipe, f"model.path={BASE}", f"rope.target_length={TARGET}", f"output.dir={out}", *extra,
        ]  # fmt: skip
    else:
        method = name.split("-")[0]
        cmd = ["extend", BASE, "--method", method, "--target-length", str(target), "--out", str(out)]
    trains = name in TRAINED
    record = out / "run.json"
    if trains and (not record.is_file() or json.loads(record.read_text()).get("status") != "complete"):
        # A run stopped earlier (SIGTERM checkpoints at a step boundary) continues; its steps' own times add up.
        resumed = record.is_file()
        _ctxext([*cmd, "--resume"] if resumed else cmd, log)
        stages[TRAINED[name]] = {**_training_stage(out), "command": "ctxext " + " ".join(cmd), "resumed": resumed}
        _save(store)
    elif not trains and not (out / "config.json").is_file():
        seconds = _ctxext(cmd, log)
        stages[name] = {"seconds": round(seconds), "command": "ctxext " + " ".join(cmd)}
        if name.startswith("longrope"):  # what the budget bought: the page sets it beside the paper's search
            found = json.loads((out / "search.json").read_text())
            stages[name] |= {k: found[k] for k in ("evaluations", "ended", "score", "best_seed")}
        _save(store)
    if name == "calibrated" and "calibrate" not in stages:
        cal = ["calibrate", str(out), *opts.calibrate_override]
        seconds = _ctxext(cal, log)
        stages["calibrate"] = {"seconds": round(seconds), "command": "ctxext " + " ".join(cal)}
        _save(store)
    return str(out)


# Rows whose training speed the page reports (the fine-tune itself trains 4,096-token rows).
THROUGHPUT_ROWS = (2048, 4096)


def throughput(work: Path, store: dict[str, Any], opts: argparse.Namespace) -> None:
    """Training tokens/s and peak memory at each of :data:`THROUGHPUT_ROWS`: 4 steps of one row each of the
    fine-tune's recipe (the first step's warm-up is in the median's tail), stored as stages."""
    import shutil

    stages = store.setdefault("stages", {})
    for rows in THROUGHPUT_ROWS:
        name = f"throughput-{rows}"
        if name in stages:
            continue
        out = work / name
        if out.exists():
            shutil.rmtree(out)  # an earlier attempt of ours, stopped before it was stored
        cmd = [
            "train", opts.recipe, f"model.path={BASE}", f"rope.target_length={TARGET}", f"train.seq_len={rows}",
            "train.max_steps=4", "train.warmup_steps=1", "train.gradient_accumulation_steps=1",
            "train.eval_every=null", "train.save_every=null", "calibrate.when=never", "data.max_documents=40",
            f"output.dir={out}",
        ]  # fmt: skip
        print(f"{name}: 4 steps of one {rows}-token row", flush=True)
        _ctxext(cmd, work / "commands.log")
        stages[name] = {**_training_stage(out), "command": "ctxext " + " ".join(cmd)}
        _save(store)


def probe_spec(spec: str) -> tuple[str, dict[str, int]]:
    """A probe's task name and options from its spec (``json_kv:hex=8,...``)."""
    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        option, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(f"--probe-tasks {spec}: write options as NAME=INTEGER (e.g. json_kv:hex=8)")
        options[option] = int(value)
    return name, options


def task_probe(model: Any, store: dict[str, Any], opts: argparse.Namespace) -> None:
    """Which tasks beyond the needle the base can do inside its window: ``--probe-samples`` samples of each of
    ``--probe-tasks`` (default :data:`PROBE_TASKS`) at :data:`PROBE_LENGTH` tokens (held-out template, the model's
    chat template, depths spread 0–100 %), teacher-forced, stored as stages ``in-window SPEC``."""
    from ctxext.errors import InputError
    from ctxext.evaluation.settings import decide_chat
    from ctxext.scoring.answers import score_answers
    from ctxext.tasks import Haystack
    from ctxext.tasks.chat import chat_wrap
    from ctxext.tasks.registry import get_task

    stages = store.setdefault("stages", {})
    tokenizer, n = model.tokenizer, opts.probe_samples
    chat = chat_wrap(tokenizer, decided=decide_chat(BASE))
    hay = Haystack.from_texts(tokenizer, [(DOCS_DIR / DOCS[0]).read_text(errors="replace")], 4 * PROBE_LENGTH)
    for spec in opts.probe_tasks:
        name, options = probe_spec(spec)
        key = f"in-window {spec}"
        if key in stages and stages[key].get("samples") == n:
            continue
        task = get_task(name)
        task.resolve_options(options)  # an unknown option is refused before any forward
        template = task.heldout[0] if task.heldout else 0
        started, correct, nats, problem = time.time(), 0, 0.0, None
        for i in range(n):
            rng = random.Random(f"{opts.seed}-probe-{spec}-{i}")
            try:
                sample = task.generate(
                    tokenizer, hay, PROBE_LENGTH, (i + 0.5) / n, rng, template=template, chat=chat, **options
                )
            except InputError as exc:  # a task that cannot take a chat template, say
                problem = str(exc)
                break
            scored = score_answers(model.model, [sample.ids], [sample.answer_span])[0]
            correct, nats = correct + scored.correct, nats + scored.nll / max(1, scored.n_tokens)
        stages[key] = {
            "seconds": round(time.time() - started),
            "correct": None if problem else correct,
            "samples": n,
            # How near the misses came: the answer tokens' mean NLL (nats per token, averaged over samples).
            "answer_nll": None if problem else round(nats / n, 3),
            "template": template,
            "problem": problem,
            "command": f"python -m benchmarks.real_model --only tasks --probe-samples {n} --probe-tasks {spec}",
        }
        print(f"{key}: " + (problem or f"{correct}/{n}"), flush=True)
        _save(store)


def _training_stage(run: Path) -> dict[str, Any]:
    """The fine-tune's time from its own step log (so a resumed run counts each step once): steps, seconds of
    training steps, median tokens/s, peak memory, and the load average at the end."""
    from ctxext.artifacts.run import METRICS_FILE, training_seconds

    logged = [json.loads(line) for line in (run / METRICS_FILE).read_text().splitlines()]
    steps = list({s["step"]: s for s in logged if "tokens_per_sec" in s}.values())  # a step logged twice counts once
    rates = sorted(s["tokens_per_sec"] for s in steps)
    return {
        "steps": len(steps),
        "seconds": round(training_seconds(run) or 0),
        "tokens_per_sec": round(rates[len(rates) // 2], 1) if rates else None,
        "peak_mem_mb": round(max((s.get("peak_mem_mb") or 0) for s in steps)),
        "load_average": round(os.getloadavg()[0], 1),
    }


def _load(name: str, ref: str) -> Any:
    from ctxext.models.load import ModelSpec, load_model

    # The fine-tune "before calibrate" is measured without any calibration record the run may have by then.
    return load_model(ModelSpec(ref, name=name), device=DEVICE, calibrated=name == "calibrated")


# ---------------------------------------------------------------------------------------------------------------
# Storage, estimate, run
# ---------------------------------------------------------------------------------------------------------------


def _read() -> dict[str, Any]:
    return json.loads(JSON_FILE.read_text()) if JSON_FILE.is_file() else {"cells": {}, "stages": {}}


def _save(store: dict[str, Any]) -> None:
    """Write the store, keeping the cells and stages another run of this script stored meanwhile.

    Two runs may share the file (``--only tasks`` beside a fine-tune of hours): each adds its own keys and none
    removes another's, so a save merges with what is on disk, under a lock, instead of writing its own copy over it.
    """
    import fcntl

    from ctxext.atomic import write_json_atomic

    with open(Path(tempfile.gettempdir()) / f"ctxext-bench-{JSON_FILE.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        disk = _read()
        for part in ("cells", "stages"):
            # In place: callers hold these dicts (``stages = store.setdefault(...)``) across saves.
            mine = store.setdefault(part, {})
            merged = {**disk.get(part, {}), **mine}
            mine.clear()
            mine.update(merged)
        write_json_atomic(JSON_FILE, store)


def estimate(cells: list[Cell], seconds_2k: float) -> float:
    """Seconds the cells' forwards take, scaled from one 2,048-token forward (attention quadratic in length)."""
    from ctxext.models.cost import forward_flops
    from ctxext.models.sources import config_from_folder, resolve_model_path

    config = config_from_folder(resolve_model_path(BASE))
    per = {L: seconds_2k * forward_flops(config, L, L) / forward_flops(config, 2048) for L in (ORIGINAL, MID, TARGET)}
    return sum(per[c.length] * c.forwards() for c in cells)


def run(opts: argparse.Namespace) -> None:
    """Measure every cell not yet stored, variant by variant, saving each as it completes."""
    from ctxext.models.cost import ForwardClock

    store = _read()
    store["settings"] = {
        "keys_per_input": opts.keys, "inputs": INPUTS, "kv_inputs": KV_INPUTS, "seed": opts.seed,
        "recipe_method": _recipe_method(Path(opts.recipe)),
    }  # fmt: skip
    todo = [c for c in plan_cells() if c.key not in store["cells"]]
    if opts.only:
        todo = [c for c in todo if any(c.variant.startswith(o) for o in opts.only)]
    if opts.max_length:
        todo = [c for c in todo if c.length <= opts.max_length]
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    base = _load("base", prepare("base", work, store, opts))
    clock = ForwardClock.measure(base.model, 2048)
    secs = estimate(todo, clock.seconds)
    print(f"{len(todo)} cells to measure ({len(store['cells'])} done): forwards ≈ {secs / 3600:.1f} h "
          f"({clock.note()}; building variants, training and calibration come on top)")  # fmt: skip
    if opts.estimate:
        for c in todo:
            print(f"  {c.key}: {c.forwards()} forward(s)")
        return
    if not opts.only or "throughput" in opts.only:
        throughput(work, store, opts)
    if not opts.only or "tasks" in opts.only:
        task_probe(base, store, opts)
    inputs: dict[tuple[int, str], list[Any]] = {}
    loaded = {"base": base}
    for cell in todo:
        if cell.variant not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[cell.variant] = _load(cell.variant, prepare(cell.variant, work, store, opts))
        model = loaded[cell.variant]
        if (cell.length, cell.kind) not in inputs:
            inputs[(cell.length, cell.kind)] = build_inputs(
                model.tokenizer, cell.length, cell.kind, opts.keys, opts.seed
            )
        print(f"{cell.key}: {cell.forwards()} forward(s) of {cell.length} tokens")
        started, load = time.time(), os.getloadavg()[0]
        result = measure(model.model, inputs[(cell.length, cell.kind)], cell.length, cell.kind)
        result["seconds"] = round(time.time() - started)
        # Wall times are comparable only on a quiet machine: the load when the cell started says whether it was.
        result["load_average"] = round(load, 1)
        result["attention_temperature"] = model.attention_temperature
        store["cells"][cell.key] = result
        _save(store)
    render(store)


# ---------------------------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------------------------


def _retrieval(cell: dict[str, Any]) -> tuple[list[bool], list[int], list[float]]:
    correct, clusters, depths = [], [], []
    for i, entry in enumerate(cell["inputs"]):
        correct += entry["correct"]
        clusters += [i] * len(entry["correct"])
        depths += entry["depths"]
    return correct, clusters, depths


def _rate(cell: dict[str, Any]) -> str:
    from ctxext.scoring.stats import cluster_rate

    correct, clusters, _ = _retrieval(cell)
    r = cluster_rate(correct, clusters)
    ci = "" if math.isnan(r["ci_low"]) else f" [{100 * r['ci_low']:.0f}, {100 * r['ci_high']:.0f}]"
    return f"{100 * r['rate']:.0f}{ci} (n={r['trials']}, {r['clusters']} inputs)"


def _ppl_entry(cell: dict[str, Any], bucket: int | None = None) -> dict[str, Any]:
    # The cell's perplexity (over its inputs, or one position bucket of them) with its bootstrap interval.
    import numpy as np

    from ctxext.scoring.stats import ppl_entry

    sums = np.array([sum(e["nll_sums"]) if bucket is None else e["nll_sums"][bucket] for e in cell["inputs"]])
    counts = np.array([sum(e["counts"]) if bucket is None else e["counts"][bucket] for e in cell["inputs"]])
    return ppl_entry(sums, counts)


def _ppl(cell: dict[str, Any], bucket: int | None = None) -> str:
    e = _ppl_entry(cell, bucket)
    return f"{e['ppl']:.2f} [{e['ci_low']:.2f}, {e['ci_high']:.2f}]"


def _by_depth(cell: dict[str, Any]) -> str:
    # Correct / trials in each fifth of the depths (0–20 %, …, 80–100 %).
    correct, _, depths = _retrieval(cell)
    parts = []
    for band in range(DEPTH_BANDS):
        hit = [c for c, x in zip(correct, depths, strict=True) if min(int(x * DEPTH_BANDS), DEPTH_BANDS - 1) == band]
        parts.append(f"{sum(hit)}/{len(hit)}")
    return " · ".join(parts)


def _progress_lines(cells: dict[str, Any]) -> list[str]:
    # A page of a run still under way says so first: the table below is partial, the conclusions not yet drawn.
    total = len(plan_cells())
    if len(cells) >= total:
        return []
    return [f"**Incomplete: {len(cells)} of {total} cells measured.** The same command resumes the run.", ""]


def _wall(cell: dict[str, Any]) -> str:
    # A cell measured while other work ran on the 2 cores took longer than the model needs: say so beside it.
    load = cell.get("load_average", 0.0)
    return f"{cell['seconds']}" + (f" (load {load:g}: not a timing)" if load > 2.5 else "")


def _paired(a: dict[str, Any], b: dict[str, Any]) -> str:
    import numpy as np

    from ctxext.scoring.stats import mcnemar_exact, paired_cluster_difference, paired_ppl_ratio, sign_flip_test

    ca, clusters, _ = _retrieval(a)
    cb, _, _ = _retrieval(b)
    diff = paired_cluster_difference(ca, cb, clusters)
    mc = mcnemar_exact(ca, cb)
    # Few inputs: the bootstrap's p leans on a normal approximation that 3-5 clusters cannot support, so the
    # exact sign-flip test over the inputs stands beside it (it cannot go below 2 / 2^inputs).
    per_input = [
        (sum(x["correct"]) - sum(y["correct"])) / len(x["correct"])
        for x, y in zip(a["inputs"], b["inputs"], strict=True)
    ]
    flip = sign_flip_test(per_input)
    out = (
        f"retrieval {100 * diff['difference']:+.0f} points [{100 * diff['ci_low']:+.0f}, {100 * diff['ci_high']:+.0f}] "
        f"(exact sign-flip over the {flip['units']} inputs p = {flip['p_value']:.2g}, smallest possible "
        f"{flip['smallest_p']:.2g}; cluster bootstrap p = {diff['p_value']:.2g}; keys as independent: "
        f"+{mc['only_a']}/−{mc['only_b']}, McNemar p = {mc['p_value']:.2g})"
    )
    if "nll_sums" in a["inputs"][0] and "nll_sums" in b["inputs"][0]:
        sa = np.array([sum(e["nll_sums"]) for e in a["inputs"]])
        sb = np.array([sum(e["nll_sums"]) for e in b["inputs"]])
        counts = np.array([sum(e["counts"]) for e in a["inputs"]], dtype=float)
        r = paired_ppl_ratio(sa, sb, counts)
        flip = sign_flip_test((sa - sb) / counts)
        out += (
            f"; ppl ratio {r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] (exact sign-flip p = "
            f"{flip['p_value']:.2g}, smallest possible {flip['smallest_p']:.2g}; bootstrap p = {r['p_bootstrap']:.2g})"
        )
    return out


def render(store: dict[str, Any]) -> None:
    """Write the page from the stored cells (missing cells shown as not yet measured)."""
    from benchmarks._common import measured_on

    cells = store["cells"]
    lines = [
        f"# SmolLM2-135M-Instruct, 8k → {TARGET // 1024}k: the whole journey on a real checkpoint ({DEVICE})",
        "",
        "Commands: `nice -n 5 python -m benchmarks.real_model` (resumable; `--estimate` first), then "
        "`python -m benchmarks.real_model --render-only`.",
        "",
        measured_on(),
        "",
        *_progress_lines(cells),
        f"Inputs: the Vim reference manuals ({', '.join(DOCS)}), each one's first tokens truncated to the length, "
        f"{store.get('settings', {}).get('keys_per_input', '?')} needles per input at depths 0–100 % with a "
        f"question and answer per needle after the text (the held-out needle form {TEMPLATE}, in the model's chat "
        "template as `ctxext eval` uses it by default); perplexity over the manual's own tokens (needles and "
        "questions left out). Retrieval: % of keys correct, teacher-forced, 95 % cluster-bootstrap interval over "
        "inputs. Perplexity: 95 % bootstrap over inputs.",
        "",
        "| variant | length | retrieval % [95 %] | by depth, fifths 0 → 100 % | perplexity [95 %] | wall s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in plan_cells():
        if c.kind != "keys":
            continue
        got = cells.get(c.key)
        if got is None:
            lines.append(f"| {c.variant} | {c.length} | not yet measured | | | |")
            continue
        lines.append(f"| {c.variant} | {c.length} | {_rate(got)} | {_by_depth(got)} | {_ppl(got)} | {_wall(got)} |")
    if "calibrated" not in variants():
        lines += [
            "",
            "No calibrated variant on a CPU: `ctxext calibrate` at the target with trials that could detect a "
            "temperature's effect would take far longer than the fine-tune here (`ctxext train` prints its "
            "estimate when it skips the calibration, in `commands.log`); the GPU check (`scripts/gpu-check.sh`) "
            "measures it.",
        ]
    if any(c.variant.startswith("longrope") and c.key not in cells for c in plan_cells()):
        lines += [
            "",
            "LongRoPE is not measured yet on this CPU: its search (`ctxext search`, as in `commands.log`) first checks "
            "which needle forms the base retrieves in its window (32 to 128 forwards of 8,192 tokens), then scores "
            "each of at least 6 candidates on 8 sequences of 16,384 tokens: hours here, which the search states "
            "when it starts. The GPU check (`scripts/gpu-check.sh`) runs it.",
        ]
    lines += [
        "",
        "The retrieval rows are RULER's multi-key needle task (MK-NIAH) with every key asked: the needles of an "
        "input have distinct names, so each question has the input's other needles as distractors.",
        "",
        "## Key-value lookup (a JSON-like object of random keys, 11 lookups per input)",
        "",
        "HELMET's json_kv: measured on the training-free variants before the in-window task probe (below) showed "
        "that this model cannot do it even inside its own window (json_kv, with 8-hex-digit values too), so these "
        "rows measure nothing and the trained variants skip them. Of the probe's tasks beyond the needle (all "
        "but multikey, a needle task), none does measurably better than guessing in the window (icl: one label "
        "of 6); the multi-key retrieval above is the task of the table.",
        "",
        "| variant | length | correct % [95 %] | by depth 0 → 100 % |",
        "| --- | --- | --- | --- |",
    ]
    for c in plan_cells():
        if c.kind == "kv":
            got = cells.get(c.key)
            lines.append(
                f"| {c.variant} | {c.length} | {_rate(got) if got else 'not yet measured'} | "
                f"{_by_depth(got) if got else ''} |"
            )
    lines += _probe_lines(store) + _comparisons(store) + _stages(store)
    PAGE.write_text("\n".join(lines) + "\n")
    print(f"wrote {PAGE}")


def _probe_lines(store: dict[str, Any]) -> list[str]:
    from ctxext.scoring.stats import wilson_interval

    probes = {k.removeprefix("in-window "): v for k, v in store.get("stages", {}).items() if k.startswith("in-window ")}
    if not probes:
        return []
    title = f"## Tasks beyond the needle inside the base's window ({PROBE_LENGTH:,} tokens, teacher-forced)"
    lines = ["", title, ""]
    for name, got in probes.items():
        if got["correct"] is None:
            lines.append(f"- {name}: not measured ({got['problem']})")
            continue
        low, high = wilson_interval(got["correct"], got["samples"])
        nll = f", answer NLL {got['answer_nll']:.2f} nats/token" if got.get("answer_nll") is not None else ""
        lines.append(f"- {name} (template {got['template']}): {got['correct']}/{got['samples']} "
                     f"[{100 * low:.0f}, {100 * high:.0f}] %{nll}")  # fmt: skip
    return lines


def _recipe_method(recipe: Path) -> str:
    # The fine-tune's extension method: its training-free start.
    import yaml

    return str(yaml.safe_load(recipe.read_text())["rope"]["method"])


def _gain(tuned: dict[str, Any], best: dict[str, Any], name: str, length: int) -> str:
    """One plain clause: the fine-tune's retrieval and perplexity against the best training-free variant's."""
    from ctxext.scoring.stats import paired_cluster_difference

    ca, clusters, _ = _retrieval(tuned)
    cb, _, _ = _retrieval(best)
    diff = paired_cluster_difference(ca, cb, clusters)
    said = "more" if diff["ci_low"] > 0 else "less" if diff["ci_high"] < 0 else "its interval reaches no difference"
    mine, theirs = _ppl_entry(tuned)["ppl"], _ppl_entry(best)["ppl"]
    return (
        f"at {length:,} tokens it retrieves {100 * sum(ca) / len(ca):.0f} % of keys, {name} "
        f"{100 * sum(cb) / len(cb):.0f} % ({said}), at perplexity {mine:.2f} vs {theirs:.2f} "
        f"({100 * (mine / theirs - 1):+.0f} %)"
    )


def _comparisons(store: dict[str, Any]) -> list[str]:
    cells = store["cells"]
    lines = ["", "## Paired comparisons", ""]
    gains = []
    for length in (MID, TARGET):
        free = [f"{m}-{length // 1024}k@{length}:keys" for m in METHODS] + (
            [f"longrope-{MID // 1024}k@{MID}:keys"] if length == MID else []
        )
        have = [k for k in free if k in cells]
        tuned = f"finetuned@{length}:keys"
        if not have or tuned not in cells:
            lines.append(f"- {length} tokens: not yet measured")
            continue
        best = max(have, key=lambda k: sum(_retrieval(cells[k])[0]))
        lines.append(f"- {length} tokens, fine-tuned vs the best training-free ({best.split('@')[0]}): "
                     f"{_paired(cells[tuned], cells[best])}")  # fmt: skip
        gains.append(_gain(cells[tuned], cells[best], best.split("@")[0], length))
        cal = f"calibrated@{length}:keys"
        if cal in cells:
            lines.append(f"- {length} tokens, calibrated vs fine-tuned: {_paired(cells[cal], cells[tuned])}")
    # What training added to its own training-free start (the recipe's method at the target, untrained).
    # As the run stored it; a store written before runs recorded it: the default recipe's.
    method = store.get("settings", {}).get("recipe_method") or _recipe_method(ROOT / RECIPE)
    start = f"{method}-{TARGET // 1024}k"
    for length in (ORIGINAL, TARGET):
        tuned, untrained = f"finetuned@{length}:keys", f"{start}@{length}:keys"
        if tuned in cells and untrained in cells:
            lines.append(f"- {length} tokens, fine-tuned vs its training-free start ({start}): "
                         f"{_paired(cells[tuned], cells[untrained])}")  # fmt: skip
    # The default recipe's fine-tune against the journey's (the same tokens) and against its own start.
    default_start = f"{_recipe_method(ROOT / DEFAULT_RECIPE)}-{TARGET // 1024}k"
    for length in (ORIGINAL, MID, TARGET):
        mine = f"finetuned-default@{length}:keys"
        for other, what in (("finetuned", "the journey's fine-tune"), (default_start, "its training-free start")):
            theirs = f"{other}@{length}:keys"
            if mine in cells and theirs in cells:
                lines.append(f"- {length} tokens, the default recipe's fine-tune vs {what} ({other}): "
                             f"{_paired(cells[mine], cells[theirs])}")  # fmt: skip
    base = cells.get(f"base@{ORIGINAL}:keys")
    for name in [v for v in variants() if v != "base"]:
        key = f"{name}@{ORIGINAL}:keys"
        if base is not None and key in cells:
            lines.append(f"- in-window cost ({ORIGINAL} tokens), {name} vs base: {_paired(cells[key], base)}")
    if gains:  # the answer first, in words; the tests behind it follow
        lines[3:3] = ["**What the fine-tune gained over the best training-free method**: " + "; ".join(gains) + ".", ""]
    return lines


def _stages(store: dict[str, Any]) -> list[str]:
    lines = ["", "## Stages (wall time, command)", ""]
    for name, stage in store.get("stages", {}).items():
        extra = ""
        if stage.get("tokens_per_sec"):
            resumed = ", resumed" if stage.get("resumed") else ""
            extra = (
                f" ({stage['steps']} steps, median {stage['tokens_per_sec']} tokens/s, peak {stage['peak_mem_mb']} MB, "
                f"load average {stage['load_average']}{resumed})"
            )
        if stage.get("evaluations"):
            seed = stage["best_seed"]
            extra = (
                f" ({stage['evaluations']} candidates scored before its {stage['ended']} ran out; objective "
                f"{stage['score']:.4f}, its best seed ({seed['name']}) {seed['score']:.4f}; LongRoPE's own search "
                "evolves 64 candidates over 40 generations)"
            )
        lines.append(f"- {name}: {stage['seconds']} s{extra} — `{stage['command']}`")
    return lines


def configure(target: int, device: str, results: str, scale: int) -> None:
    """Set the run's lengths, device, files and input counts (the defaults: the CPU table, 8k → 32k)."""
    global TARGET, MID, DEVICE, JSON_FILE, PAGE, INPUTS, KV_INPUTS  # one run per process: module-wide settings
    if target <= ORIGINAL or target % ORIGINAL:
        raise SystemExit(f"--target {target}: use a multiple of {ORIGINAL} above it (e.g. 32768 or 65536)")
    TARGET, MID, DEVICE = target, target // 2, device
    JSON_FILE, PAGE = RESULTS / f"{results}.json", RESULTS / f"{results}.md"
    # A forward at the target costs most: fewest inputs there (before --scale).
    INPUTS = {ORIGINAL: 5 * scale, MID: 4 * scale, TARGET: 3 * scale}
    KV_INPUTS = {ORIGINAL: 2 * scale, TARGET: 1 * scale}


def main(argv: list[str] | None = None) -> None:
    """Parse the options and run (or estimate, or render)."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/real_model", help="folder for the variants' models and runs")
    parser.add_argument("--keys", type=int, default=4, help="needles per long input (depths spread 0–100 %%)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="measure only variants starting with these names (throughput: the rows; tasks: the in-window probe)",
    )
    parser.add_argument("--max-length", type=int, default=0, help="measure only cells up to this many tokens")
    parser.add_argument("--probe-samples", type=int, default=12, help="samples per task of the in-window task probe")
    parser.add_argument(
        "--probe-tasks", nargs="+", default=list(PROBE_TASKS), help="the probe's tasks, NAME[:OPTION=N,...] each"
    )
    parser.add_argument("--recipe", default=RECIPE, help="the fine-tune's recipe")
    parser.add_argument("--train-override", nargs="*", default=[], help="key=value overrides for the fine-tune")
    parser.add_argument("--calibrate-override", nargs="*", default=[], help="flags for ctxext calibrate")
    parser.add_argument("--search-budget", default="40m", help="time budget of the LongRoPE search at 16k")
    parser.add_argument("--estimate", action="store_true", help="print the cells and their time, run nothing")
    parser.add_argument("--render-only", action="store_true", help="rewrite the page from real_model.json")
    parser.add_argument("--device", default="cpu", help="where the variants run (cuda: the prepared GPU check)")
    parser.add_argument("--target", type=int, default=TARGET, help="the extended length (a power of 2 × 8,192)")
    parser.add_argument("--scale", type=int, default=1, help="inputs per length × this (more trials on a GPU)")
    parser.add_argument("--results", default="real_model", help="name of the results .json and .md")
    opts = parser.parse_args(argv)
    configure(opts.target, opts.device, opts.results, opts.scale)
    if not DOCS_DIR.is_dir():
        raise SystemExit(f"{DOCS_DIR}: the inputs are Vim's reference manuals; install them (apt install vim-runtime)")
    if opts.render_only:
        render(_read())
        return
    run(opts)


if __name__ == "__main__":
    main()
