"""Needle retrieval by key form: which of the needle's forms a base, its training-free starts and fine-tuned runs
retrieve, inside the base's window and at the target.

    python -m experiments.transfer.forms builtin:grown-neox-64 --methods llama3 yarn ntk dynamic linear \\
        --runs runs/transfer/grown-neox-64/probe-s0 --page experiments/results/forms-grown-neox-64.md

Why: the adaptive stop's probe mixes the recipe's training forms (0-2) while the transfer reading scores form 0,
the only form the grown bases retrieve in their window. A probe that plateaus may be a form the fine-tune does not
learn, not the length; and a method that loses the window before any training shows here too. Per model and form:
teacher-forced retrieval by depth at the window and at ``--factor`` × the window (the base only at its window),
``--trials`` per cell on one prompt seed (every model sees the same prompts), a Wilson 95 % interval over all
depths, and each model paired against ``--against`` (the default recipe's ``llama3``) on the same prompts (exact
McNemar). The starts are ``ctxext extend BASE --method M`` copies in ``WORK/forms/BASE-M`` (reused when there); the
results are kept in ``WORK/forms/BASE.json``, so a rerun measures only what is new.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from experiments.transfer.read import write_page
from experiments.transfer.run import DEPTHS, base_name, needle_outcomes


def _key(label: str, form: int, opts: Any) -> str:
    """A (model, form)'s entry in the store: its prompts and lengths are the trials, seed and factor's."""
    return f"{label}|{form}|{opts.trials}|{opts.seed}|{opts.factor}x"


def _cell(outcomes: dict[str, list[int]] | None, length: int) -> str:
    """One length's retrieval: by depth, then all depths with the Wilson interval."""
    from ctxext.scoring.stats import wilson_interval

    if outcomes is None:
        return "does not fit"
    by_depth = [outcomes[f"{length}/{d}"] for d in DEPTHS]
    hits, n = sum(map(sum, by_depth)), sum(map(len, by_depth))
    low, high = wilson_interval(hits, n)
    depths = " · ".join(f"{100 * sum(o) / len(o):.0f}" for o in by_depth)
    return f"{depths} ({100 * hits / n:.0f} [{100 * low:.0f}, {100 * high:.0f}])"


def measure(models: dict[str, str], lengths: dict[str, list[int]], forms: list[int], opts: Any, store: Path) -> dict:
    """Each (model, form)'s outcomes, measured unless the store has them (``None``: the form does not fit)."""
    import torch
    from transformers import AutoTokenizer

    from ctxext.errors import InputError
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.texts import iter_texts
    from ctxext.tasks import Haystack

    torch.set_num_threads(opts.threads)
    results: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {}
    hay = None
    for label, ref in models.items():
        todo = [f for f in forms if _key(label, f, opts) not in results]
        if not todo:
            continue
        if hay is None:
            tokenizer = AutoTokenizer.from_pretrained(models[next(iter(models))])
            hay = Haystack.from_texts(tokenizer, iter_texts("builtin:stdlib"), 200_000, "builtin:stdlib")
        loaded = load_model(ModelSpec(ref, name=label), device="cpu")
        for form in todo:
            try:
                out: dict[str, list[int]] | None = needle_outcomes(
                    loaded, lengths[label], opts.seed, opts.trials, hay, form
                )
            except InputError:  # the form's prompt is longer than the window
                out = None
            results[_key(label, form, opts)] = out
            store.write_text(json.dumps(results) + "\n")
            print(f"  {label} form {form}: " + " | ".join(_cell(out, n) for n in lengths[label]), flush=True)
    return results


def paired_lines(results: dict, models: dict[str, str], lengths: dict[str, list[int]], opts: Any) -> list[str]:
    """Each model against ``--against`` on the same prompts, per form and length (exact McNemar over all depths)."""
    from ctxext.scoring.stats import mcnemar_exact

    ref = opts.against
    if ref not in models:
        return []
    lines = [
        "",
        f"Paired against `{ref}` on the same prompts (all depths; +/−: keys only one of the two retrieves):",
        "",
    ]
    for label in models:
        if label in ("base", ref):
            continue
        for form in opts.forms:
            mine, theirs = (results[_key(m, form, opts)] for m in (label, ref))
            if mine is None or theirs is None:
                continue
            cells = []
            for n in lengths[label]:
                a, b = ([bool(x) for d in DEPTHS for x in out[f"{n}/{d}"]] for out in (mine, theirs))
                if a == b:
                    continue
                t = mcnemar_exact(a, b)
                cells.append(f"{n} tokens +{t['only_a']}/−{t['only_b']}, p = {t['p_value']:.2g}")
            if cells:
                lines.append(f"- `{label}`, form {form}: " + "; ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> None:
    """Build the starts, measure every (model, form) not yet measured, print (and write) the table."""
    from ctxext.cli.quiet import quiet_third_party
    from ctxext.models.sources import resolve_model_path
    from ctxext.recipe.window import model_window

    quiet_third_party()
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("base", help="the base: a built-in name or a folder")
    parser.add_argument("--methods", nargs="*", default=["llama3"], help="training-free starts (ctxext extend)")
    parser.add_argument("--runs", nargs="*", default=[], help="fine-tuned run folders of this base")
    parser.add_argument("--forms", type=int, nargs="+", default=[0, 1, 2, 4], help="needle forms (templates)")
    parser.add_argument("--factor", type=int, default=4, help="the target, in windows")
    parser.add_argument("--trials", type=int, default=60, help="trials per (length, depth) cell")
    parser.add_argument("--seed", type=int, default=7, help="the prompts' seed (experiments.transfer.run's scheme)")
    parser.add_argument("--against", default="llama3", help="the model the others are paired against")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--work", default="runs/transfer", help="the starts' and results' parent folder")
    parser.add_argument("--page", default=None, help="write the table to this markdown file too")
    args = parser.parse_args(argv)
    window = model_window({"model": {"path": args.base}})
    target = args.factor * window
    folder = Path(args.work) / "forms"
    folder.mkdir(parents=True, exist_ok=True)
    name = base_name(args.base)
    models = {"base": str(resolve_model_path(args.base))}
    for method in args.methods:
        out = folder / f"{name}-{method}"
        if not (out / "config.json").is_file():
            cmd = ["extend", args.base, "--method", method, "--target-length", str(target), "--out", str(out)]
            done = subprocess.run([sys.executable, "-m", "ctxext", *cmd], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"ctxext {' '.join(cmd)} failed: {done.stdout}{done.stderr}")
        models[method] = str(out)
    models.update({Path(run).name: run for run in args.runs})
    lengths = {label: [window] if label == "base" else [window, target] for label in models}
    results = measure(models, lengths, args.forms, args, folder / f"{name}.json")
    lines = [
        f"| model | form | {window} tokens (window): by depth {', '.join(map(str, DEPTHS))} % (all [95 %]) "
        f"| {target} tokens ({args.factor}×) |",
        "| --- | --- | --- | --- |",
    ]
    for label in models:
        for form in args.forms:
            out = results[_key(label, form, args)]
            cells = [_cell(out, n) for n in lengths[label]] + ([""] if label == "base" else [])
            lines.append(f"| {label} | {form} | {' | '.join(cells)} |")
    lines += paired_lines(results, models, lengths, args)
    print("\n".join(lines))
    if args.page:
        about = (
            f" ({args.trials} trials per cell, prompt seed {args.seed}; one thread of the shared 2-core CPU; the "
            "docstring of `experiments/transfer/forms.py` says what is measured). Forms: 0 `KEY_{name} = {key}`, 1 "
            "`config['{name}'] = {key}`, 2 `# The secret number of {name} is {key}.`, 4 `{name}_id = {key}` "
            "(`ctxext/tasks/needle.py`; the default recipe trains on 0-2)."
        )
        write_page(Path(args.page), f"{name}: needle retrieval by key form", __spec__.name, argv, about, lines)


if __name__ == "__main__":
    main()
