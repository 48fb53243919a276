"""Grow ``builtin:grown-code-64``: a small Llama pretrained here, at a 64-token window, on stdlib code.

No real checkpoint can be downloaded on these machines and a random model says nothing about
context extension, so ctxext grows its own. The recipe is :func:`ctxext.models.grown.grow`,
deterministic (seeded); this script is its command line, and measures what it grew:

1. split the Python standard library's source (:func:`ctxext.models.builtin.stdlib_files`) into training
   files and held-out files (every file whose ``sha1(path relative to the stdlib root) mod 10 == 0``);
2. train a byte-level BPE tokenizer on the training files only;
3. pretrain a ~4.2M-parameter Llama (4 layers, hidden 256, 4 heads, rope_theta 10000) at a 64-token
   window on the training files, where a share of sequences carry a key/value needle
   (``KEY_ab = 68310`` on one line, ``assert KEY_ab == 68310`` later) and a share carry a repeated
   span, at distances spread uniformly over the window, so that the model learns to use its whole
   window (a plain-code model of this size uses only its last few dozen tokens);
4. save model + tokenizer (fp32 safetensors) to ``ctxext/resources/grown-code-64/``;
5. measure on the held-out files: (1) context use (perplexity on the same tokens with the full window
   versus one eighth of it, bootstrap CI over documents); (2) needle retrieval by depth inside the
   window; (3) both at 4x the window, unscaled and with training-free RoPE methods.

Usage::

    nice -n 10 python -m benchmarks.grow_base                 # grow + measure (~40 min on 2 cores)
    python -m benchmarks.grow_base --measure-only             # re-measure the saved model (~2 min)
    python -m benchmarks.grow_base --steps 20 --out /tmp/g    # smoke run
    # other shapes (docs/grown-model.md): Mistral or Qwen2 with GQA at a 128-token window, GPT-NeoX with
    # partial rotary
    python -m benchmarks.grow_base --arch mistral --heads 4 --kv-heads 2 --window 128 --short-context 16 \
        --out ctxext/resources/grown-mistral-128
    python -m benchmarks.grow_base --arch gpt_neox --rotary-pct 0.25 --intermediate 1024 \
        --out ctxext/resources/grown-neox-64
    # tied embeddings (one matrix is the input embedding and the output head, as SmolLM2's):
    python -m benchmarks.grow_base --arch qwen2 --heads 4 --kv-heads 2 --window 96 --tie-embeddings --out DIR
    # builtin:grown-code-64-mk: two further stages on windows with 2-4 keys, asking for one, with an extra
    # loss on the asked key's answer (without it, 3,600 steps of such windows never taught key selection):
    python -m benchmarks.grow_base --init-from ctxext/resources/grown-code-64 --out /tmp/grow-mka --skip-measure \
        --steps 800 --lr 1e-3 --warmup 20 --needle-share 0.2 --multikey-share 0.4 --answer-weight 1.0 --seed 5
    python -m benchmarks.grow_base --init-from /tmp/grow-mka --out ctxext/resources/grown-code-64-mk \
        --steps 600 --lr 7e-4 --warmup 20 --needle-share 0.2 --multikey-share 0.5 --answer-weight 2.0 --seed 6

Everything measured is printed and written to ``grow_report.json`` / ``grow_report.md`` in the
output folder. ``--out`` is replaced only when this script wrote it (its ``.ctxext-output.json`` says
``grown-model``); a folder without that manifest (the packaged ones predate it) is left alone: move it
away first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctxext.errors import CtxextError
from ctxext.models.grown import REPORT_JSON, GrowSettings, Needles, TrainingSequences, grow, load_saved, snap
from ctxext.models.grown.arch import ARCHITECTURES
from ctxext.models.grown.data import encode_files, split_files
from ctxext.resources import RESOURCES

DEFAULT_OUT = RESOURCES / "grown-code-64"


@dataclass
class Settings(GrowSettings):
    """Every knob of the recipe and of the measurements; each is also a ``--flag`` (underscores become dashes)."""

    needle_trials: int = 30
    depths: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    extend_factor: int = 4
    methods: tuple[str, ...] = ("none", "linear", "ntk", "dynamic", "yarn")
    short_context: int = 8  # the cut context of measurement (1): one eighth of the window
    max_targets_per_doc: int = 512
    bootstrap: int = 2000
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- measurements


def context_use(model, docs: list[np.ndarray], lo: int, settings: list[tuple[str, int, int]], s: Settings):
    """Per-document NLL sums of the same target tokens under several context settings.

    Each target is scored by ctxext's sliding-window scorer on the document from ``window - stride``
    tokens before ``lo``: the windows of ``window`` tokens move by ``stride`` and score only their last
    ``stride`` tokens, so every target sees ``window - stride`` to ``window - 1`` tokens of context.

    Args:
        lo: first target position in each document (documents shorter than ``lo + 64`` are skipped).
        settings: (name, window, stride) triples.

    Returns:
        {name: array of per-document NLL sums}, array of per-document target counts.
    """
    from ctxext.scoring.nll import sliding_nll

    sums: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    counts = []
    for doc in docs:
        n = min(len(doc) - lo, s.max_targets_per_doc) // 64 * 64
        if n <= 0:
            continue
        counts.append(n)
        for name, window, stride in settings:
            ids = torch.from_numpy(doc[lo - (window - stride) : lo + n])
            nll = sliding_nll(model, ids, window, stride, reset_rope=True)[-n:]
            sums[name].append(float(nll.sum()))
    return {k: np.asarray(v) for k, v in sums.items()}, np.asarray(counts, dtype=np.float64)


def bootstrap_gap(a: np.ndarray, b: np.ndarray, counts: np.ndarray, reps: int, seed: int) -> dict[str, Any]:
    """Mean per-token NLL gap ``a - b`` with a 95% paired bootstrap CI over documents, and ppl ratio."""
    from ctxext.scoring.stats import bootstrap_mean_diff

    gap = (a.sum() - b.sum()) / counts.sum()
    lo, hi = bootstrap_mean_diff(a, b, counts, resamples=reps, seed=seed)
    return {
        "nll_gap": float(gap),
        "nll_gap_ci95": [lo, hi],
        "ppl_ratio": float(math.exp(gap)),
        "ppl_ratio_ci95": [math.exp(lo), math.exp(hi)],
    }


def needle_accuracy(model, needles: Needles, docs: list[np.ndarray], length: int, s: Settings, seed: int):
    """Needle retrieval by depth in prompts of ``length`` tokens (answer included) from held-out code.

    Exact match under greedy decoding, scored teacher-forced by ctxext's ``score_answers``: greedy
    decoding produces the answer exactly when every answer token is the arg-max given the correct
    earlier tokens.

    Returns:
        {depth: accuracy}, and the mean needle-to-query distance (tokens) per depth.
    """
    from ctxext.scoring.answers import score_answers

    rng = np.random.default_rng(seed)
    long_docs = [d for d in docs if len(d) >= length]
    acc, dist = {}, {}
    for depth in s.depths:
        seqs, spans, gaps = [], [], []
        for _ in range(s.needle_trials):
            needle, prompt, answer = needles.sample(rng)
            # The query starts a new line, as in training (where it is placed at a line start).
            prompt = needles.newline + prompt
            n = length - len(needle) - len(prompt) - len(answer)
            doc = long_docs[int(rng.integers(0, len(long_docs)))]
            start = int(rng.integers(0, len(doc) - n + 1))
            code = doc[start : start + n]
            at = snap(needles.boundaries(code), depth * n)
            seqs.append([*code[:at].tolist(), *needle, *code[at:].tolist(), *prompt, *answer])
            spans.append((length - len(answer), length))
            # Tokens from the start of the needle line to the first answer token.
            gaps.append(len(needle) + n - at + len(prompt))
        scores = score_answers(model, seqs, spans)
        acc[depth] = float(np.mean([score.correct for score in scores]))
        dist[depth] = float(np.mean(gaps))
    return acc, dist


def multikey_accuracy(model, needles: Needles, docs: list[np.ndarray], s: Settings, keys: int, seed: int):
    """Multi-key retrieval inside the window: ``keys`` needles with distinct names in held-out code, the
    query asks for one (the training stages' windows, drawn from held-out files); teacher-forced exact match.

    Returns:
        (accuracy, trials): every trial's window has exactly ``keys`` needles unless they cannot fit.
    """
    from ctxext.scoring.answers import score_answers

    data = TrainingSequences(np.concatenate(docs), needles, s, seed)
    trials = s.needle_trials * len(s.depths)
    drawn = [data.multikey_sequence(count=keys) for _ in range(trials)]
    scores = score_answers(model, [seq.tolist() for seq, _ in drawn], [span for _, span in drawn])
    return float(np.mean([score.correct for score in scores])), trials


def patched(path: Path, method: str, target: int):
    from ctxext.rope.runtime import patch_model

    model, _ = load_saved(path)
    if method != "none":
        patch_model(model, method, target)
    return model


def measure(path: Path, s: Settings, log) -> dict[str, Any]:
    """Measurements (1)-(3) of the saved model at ``path`` on the held-out files."""
    model, tokenizer = load_saved(path)
    root, _, heldout = split_files(s.heldout_mod)
    docs = encode_files(tokenizer, heldout)
    needles = Needles(tokenizer)
    w, big, cut = s.window, s.window * s.extend_factor, s.short_context
    out: dict[str, Any] = {"heldout_files": len(heldout), "heldout_tokens": int(sum(len(d) for d in docs))}
    t0 = time.time()

    # (1) context use inside the window: same targets, full window vs one eighth of it.
    full = (f"ctx {w // 4 * 3}-{w - 1}", w, w // 4)
    short = (f"ctx {cut // 2}-{cut - 1}", cut, cut // 2)
    sums, counts = context_use(model, docs, w, [full, short], s)
    cu = {
        "targets": int(counts.sum()),
        "documents": len(counts),
        "ppl_full": float(math.exp(sums[full[0]].sum() / counts.sum())),
        "ppl_short": float(math.exp(sums[short[0]].sum() / counts.sum())),
        "full_context": full[0],
        "short_context": short[0],
        **bootstrap_gap(sums[short[0]], sums[full[0]], counts, s.bootstrap, s.seed),
    }
    out["context_use"] = cu
    log(
        f"(1) context use: ppl {cu['ppl_full']:.2f} with {full[0]} vs {cu['ppl_short']:.2f} with {short[0]} "
        f"on {cu['targets']} targets / {cu['documents']} docs; ratio {cu['ppl_ratio']:.3f} "
        f"(95% CI {cu['ppl_ratio_ci95'][0]:.3f}-{cu['ppl_ratio_ci95'][1]:.3f})"
    )

    # (2) needle retrieval by depth inside the window.
    acc, dist = needle_accuracy(model, needles, docs, w, s, seed=s.seed + 10)
    out["needle_in_window"] = {"length": w, "trials_per_depth": s.needle_trials, "accuracy": acc, "distance": dist}
    log(f"(2) needle @ {w}: " + " ".join(f"{d:.0%}:{a:.0%}" for d, a in acc.items()))
    mk, mk_trials = multikey_accuracy(model, needles, docs, s, keys=3, seed=s.seed + 30)
    out["multikey_in_window"] = {"length": w, "keys": 3, "trials": mk_trials, "accuracy": mk}
    log(f"(2b) multi-key @ {w}, 3 keys (2 distractors): {mk:.0%} of {mk_trials}")

    # (3) at extend_factor x the window: unscaled and with training-free methods.
    methods = {}
    for method in s.methods:
        m = patched(path, method, big)
        acc_big, dist_big = needle_accuracy(m, needles, docs, big, s, seed=s.seed + 20)
        acc_small, _ = needle_accuracy(m, needles, docs, w, s, seed=s.seed + 10)
        settings = [
            (f"ctx {big // 4 * 3}-{big - 1}", big, big // 4),
            (f"ctx {w // 4 * 3}-{w - 1}", w, w // 4),
            (f"ctx {cut // 2}-{cut - 1}", cut, cut // 2),
        ]
        sums_b, counts_b = context_use(m, docs, big, settings, s)
        ppl = {name: float(math.exp(sums_b[name].sum() / counts_b.sum())) for name, _, _ in settings}
        methods[method] = {
            "needle_accuracy_at_extended": acc_big,
            "needle_distance_at_extended": dist_big,
            "needle_accuracy_in_window": acc_small,
            "ppl_by_context": ppl,
            "targets": int(counts_b.sum()),
            "documents": len(counts_b),
            "extended_vs_window": bootstrap_gap(
                sums_b[settings[0][0]], sums_b[settings[1][0]], counts_b, s.bootstrap, s.seed
            ),
            "window_vs_cut": bootstrap_gap(
                sums_b[settings[2][0]], sums_b[settings[1][0]], counts_b, s.bootstrap, s.seed
            ),
        }
        log(
            f"(3) {method:8s} needle @ {big}: "
            + " ".join(f"{d:.0%}:{a:.0%}" for d, a in acc_big.items())
            + f" | @ {w} mean {np.mean(list(acc_small.values())):.0%} | ppl "
            + ", ".join(f"{k}: {v:.2f}" for k, v in ppl.items())
        )
    out["extended"] = {"length": big, "factor": s.extend_factor, "methods": methods}
    out["measure_seconds"] = round(time.time() - t0, 1)
    return out


# ---------------------------------------------------------------- report


def multikey_lines(m: dict[str, Any]) -> list[str]:
    """The report's multi-key section (none for a report measured before it existed)."""
    mk = m.get("multikey_in_window")
    if mk is None:
        return []
    return [
        f"## (2b) Multi-key retrieval inside the window ({mk['length']} tokens)",
        "",
        f"{mk['trials']} windows of held-out code with {mk['keys']} `KEY_xx = NNNNN` needles (distinct names, "
        f"random line starts), the query `assert KEY_xx ==` asks for one; greedy exact match: "
        f"**{mk['accuracy']:.0%}** (a random pick among the keys: {1 / mk['keys']:.0%}).",
        "",
    ]


def multikey_phrase(ss: dict[str, Any]) -> str:
    """The multi-key part of a stage's data, for the report ("" for a stage without multi-key windows)."""
    share = ss.get("multikey_share", 0.0)
    if not share:
        return ""
    weight = ss.get("answer_weight", 0.0)
    loss = f", their answer tokens' mean NLL added to the loss x {weight:g}" if weight else ""
    return (
        f"{share:.0%} windows with 2-{1 + ss.get('max_distractors', 3)} keys ({ss.get('key_names', 'letters')}) "
        f"asking for one{loss}, "
    )


def shape_phrase(s: dict[str, Any]) -> str:
    """``Llama, 4 heads`` / ``Qwen2, 4 heads (2 key/value: GQA)`` / ``GPT-NeoX, 4 heads, rotary 25 %``."""
    arch = s.get("arch", "llama")  # a report from before the arch setting: a Llama
    name = ARCHITECTURES[arch].name
    kv = s.get("kv_heads") or s["heads"]
    phrase = f"{name}, {s['heads']} heads" + (f" ({kv} key/value: GQA)" if kv != s["heads"] else "")
    rotary = s.get("rotary_pct", 1.0)
    return phrase + (f", rotary on {rotary:.0%} of each head" if rotary < 1 else "")


def markdown(report: dict[str, Any], name: str = "grown-code-64") -> str:
    s = report["settings"]
    lines = [f"# {name}: how it was grown and what it measures", ""]
    if "train_command" in report:
        lines.append(f"Grown with: `{report['train_command']}`  ")
    lines.append(f"Last run: `{report['command']}`  ")
    lines.append(f"Date: {report['date']}; machine: {report['machine']}")
    lines.append("")
    if "training" in report:
        t = report["training"]
        stages = [*report.get("earlier_stages", []), {"settings": s, "training": t}]
        lines += [
            "## Training",
            "",
            f"- {t['parameters'] / 1e6:.2f}M parameters: {shape_phrase(s)}, {s['layers']} layers, "
            f"hidden {s['hidden']}, MLP {s['intermediate']}, rope_theta {s['rope_theta']:g}, "
            f"window (max_position_embeddings) {s['window']}, fp32.",
            f"- Tokenizer: byte-level BPE, {s['vocab_size']} tokens, trained on the training files only.",
            f"- Data: {report['split']['train_files']} standard-library files ({t['train_stream_tokens']:,} tokens); "
            f"{report['split']['heldout_files']} held out (sha1(relative path) % {s['heldout_mod']} == 0).",
        ]
        for i, stage in enumerate(stages, 1):
            ss, tt = stage["settings"], stage["training"]
            last = [h for h in tt["history"] if "heldout_loss_plain" in h][-1]
            lines += [
                f"- Stage {i}"
                + (f" (`{stage['train_command']}`)" if "train_command" in stage else "")
                + f": {ss['needle_share']:.0%} key/value needles, {ss['repeat_share']:.0%} repeated spans "
                f"({ss['repeat_min']}-{ss['repeat_max']} tokens), "
                + multikey_phrase(ss)
                + "the rest plain code, distances uniform over the "
                f"window; AdamW (betas 0.9/0.95, weight decay {ss['weight_decay']}), lr {ss['lr']:g}, "
                f"{ss['warmup']} warm-up steps, cosine to {ss['min_lr_ratio']:g}x; {ss['steps']} steps x "
                f"{ss['batch']} sequences x {ss['window']} tokens = {tt['tokens_seen']:,} tokens; "
                f"{tt['seconds'] / 60:.1f} min; seed {ss['seed']}. Held-out loss at the end: plain code "
                f"{last['heldout_loss_plain']:.3f} (ppl {math.exp(last['heldout_loss_plain']):.1f}), "
                f"needle sequences {last['heldout_loss_needle_seqs']:.3f}."
            ]
        total_tokens = sum(st["training"]["tokens_seen"] for st in stages)
        total_min = sum(st["training"]["seconds"] for st in stages) / 60
        lines += [f"- In all: {total_tokens:,} training tokens, {total_min:.1f} min of training.", ""]
    m = report.get("measurements")
    if m:
        cu = m["context_use"]
        lines += [
            "## (1) Context use inside the window",
            "",
            f"Same {cu['targets']:,} target tokens of {cu['documents']} held-out files: ppl "
            f"**{cu['ppl_full']:.2f}** with {cu['full_context']} tokens of context vs **{cu['ppl_short']:.2f}** "
            f"with {cu['short_context']}; ratio {cu['ppl_ratio']:.3f} (95% bootstrap CI over documents "
            f"{cu['ppl_ratio_ci95'][0]:.3f}-{cu['ppl_ratio_ci95'][1]:.3f}).",
            "",
        ]
        ext = m["extended"]
        depths = list(m["needle_in_window"]["accuracy"])
        head = "| | " + " | ".join(f"{float(d):.0%}" for d in depths) + " |"
        sep = "|---" * (len(depths) + 1) + "|"
        lines += [
            f"## (2) Needle retrieval by depth inside the window ({m['needle_in_window']['length']} tokens)",
            "",
            f"{m['needle_in_window']['trials_per_depth']} trials per depth, held-out code, `KEY_xx = NNNNN` at "
            "the depth, prompt ends `assert KEY_xx ==`, greedy exact match.",
            "",
            head,
            sep,
            "| accuracy | " + " | ".join(f"{a:.0%}" for a in m["needle_in_window"]["accuracy"].values()) + " |",
            "| distance (tokens) | "
            + " | ".join(f"{x:.0f}" for x in m["needle_in_window"]["distance"].values())
            + " |",
            "",
            *multikey_lines(m),
            f"## (3) At {ext['factor']}x the window ({ext['length']} tokens), training-free",
            "",
            "Needle accuracy by depth:",
            "",
            "| method | " + " | ".join(f"{float(d):.0%}" for d in depths) + f" | mean @ {ext['length']} | "
            f"mean @ {m['needle_in_window']['length']} |",
            "|---" * (len(depths) + 3) + "|",
        ]
        first = next(iter(ext["methods"].values()))
        for name, r in ext["methods"].items():
            accs = list(r["needle_accuracy_at_extended"].values())
            small = list(r["needle_accuracy_in_window"].values())
            lines.append(
                f"| {name} | "
                + " | ".join(f"{a:.0%}" for a in accs)
                + f" | {np.mean(accs):.0%} | {np.mean(small):.0%} |"
            )
        lines += [
            "",
            "| distance (tokens) | "
            + " | ".join(f"{x:.0f}" for x in first["needle_distance_at_extended"].values())
            + " | | |",
            "",
            f"Perplexity of the same targets (positions >= {ext['length']} of {first['documents']} held-out files, "
            f"{first['targets']:,} tokens) by context given:",
            "",
            "| method | " + " | ".join(first["ppl_by_context"]) + " | extended/window ratio (95% CI) |",
            "|---" * (len(first["ppl_by_context"]) + 2) + "|",
        ]
        for name, r in ext["methods"].items():
            g = r["extended_vs_window"]
            lines.append(
                f"| {name} | "
                + " | ".join(f"{v:.2f}" for v in r["ppl_by_context"].values())
                + f" | {g['ppl_ratio']:.3f} ({g['ppl_ratio_ci95'][0]:.3f}-{g['ppl_ratio_ci95'][1]:.3f}) |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse(argv: list[str] | None) -> tuple[Settings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder to write / measure")
    parser.add_argument("--measure-only", action="store_true", help="measure the saved model, do not train")
    parser.add_argument("--init-from", type=Path, default=None, help="continue training this saved model")
    parser.add_argument("--skip-measure", action="store_true", help="train and save only")
    for f in dataclasses.fields(Settings):
        if f.name == "extra":
            continue
        default = f.default
        if isinstance(default, tuple):
            kind = type(default[0])
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=kind, nargs="+", default=None)
        elif isinstance(default, bool):  # --tie-embeddings / --no-tie-embeddings (bool("False") would be True)
            flag = f"--{f.name.replace('_', '-')}"
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(default), default=None)
    args = parser.parse_args(argv)
    values = {
        f.name: (tuple(v) if isinstance(v, list) else v)
        for f in dataclasses.fields(Settings)
        if (v := getattr(args, f.name, None)) is not None
    }
    return Settings(**values), args


def main(argv: list[str] | None = None) -> int:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    try:
        s, args = parse(argv)
    except CtxextError as exc:  # a shape no architecture can build (--arch, --kv-heads, --rotary-pct)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    out: Path = args.out
    report_path = out / REPORT_JSON

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    command = "python -m benchmarks.grow_base " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.measure_only:
        if not (out / "model.safetensors").is_file():
            print(f"no saved model in {out}; run without --measure-only first", file=sys.stderr)
            return 2
        report = json.loads(report_path.read_text()) if report_path.is_file() else {}
        # The saved recipe is the one that counts for a saved model; measurement knobs come from the flags.
        s = Settings(**{**report.get("settings", {}), **{k: v for k, v in vars(s).items() if k in MEASURE_KEYS}})
        stamp(report, s, command, trained=False)
        write_report(report, out)
    else:

        def report_files(last: Settings, report: dict[str, Any]) -> dict[str, str]:
            # Saved with the model, so the folder never lacks the record of how it was trained.
            stamp(report, last, command, trained=True)
            return report_texts(report, out.name)

        try:
            s, report = grow(s, out, log, init_from=args.init_from, report_files=report_files)
        except CtxextError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exc.exit_code
    if not args.skip_measure:
        report["measurements"] = measure(out, s, log)
        write_report(report, out)
    log(f"report: {report_path} and {out / 'grow_report.md'}")
    return 0


def stamp(report: dict[str, Any], s: Settings, command: str, trained: bool) -> None:
    """Add the settings, the command, the date and the machine to ``report`` (the command that trained it too)."""
    if trained:
        report["train_command"] = command
    report.update(
        {
            "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(s).items()},
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
            f"{s.threads} threads, Python {platform.python_version()}",
        }
    )


def report_texts(report: dict[str, Any], name: str) -> dict[str, str]:
    """The report's files: ``grow_report.json`` and ``grow_report.md``."""
    return {
        REPORT_JSON: json.dumps(report, indent=1, default=str) + "\n",
        "grow_report.md": markdown(report, name) + "\n",
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    for name, text in report_texts(report, out.name).items():
        (out / name).write_text(text)


MEASURE_KEYS = {"threads", "needle_trials", "depths", "extend_factor", "methods", "short_context"}
MEASURE_KEYS |= {"max_targets_per_doc", "bootstrap"}

if __name__ == "__main__":
    raise SystemExit(main())
