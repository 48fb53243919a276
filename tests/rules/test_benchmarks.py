"""Benchmarks and experiments are packages that run as ``python -m``, and every ``ctxext`` name they use exists.

The benchmarks import most of ctxext inside their functions, so that ``--help`` is fast; a rename in
the package would break them only when someone runs them, months later. Here each module under
``benchmarks/`` and ``experiments/`` is imported as ``python -m`` imports it (the repository root first on
``sys.path``), each ``from ctxext… import name`` anywhere in it is resolved, and each module-level path into
the package must exist. Every runnable module answers ``--help`` with its options; none edits ``sys.path``.
The result pages each name the command that regenerates them and when they were measured, and their links
resolve.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGES = ("benchmarks", "experiments")
FILES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
MODULES = [p for p in FILES if p.name != "__init__.py"]
RUNNABLE = [p for p in MODULES if not p.name.startswith("_")]
PAGES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.md"))


def _id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _package_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of every import of ctxext, benchmarks or experiments, inside functions too."""
    found: list[tuple[int, str, str | None]] = []
    tops = {"ctxext", *PACKAGES}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in tops:
            found += [(node.lineno, node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] in tops]
    return found


def _sibling_imports(path: Path) -> list[str]:
    """Imports of a module by its bare file name (``from train_memory import …``): they work only as a script."""
    siblings = {p.stem for p in MODULES}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] in siblings]
    return found


def test_every_benchmark_and_experiment_is_collected() -> None:
    names = {_id(p) for p in MODULES}
    expected = {"benchmarks/grow_base.py", "benchmarks/_common.py", "experiments/mix_sweep/qeval.py"}
    assert expected <= names
    # Packages, so that `python -m benchmarks.NAME` imports `benchmarks._common` without a path edit.
    assert all((ROOT / p / "__init__.py").is_file() for p in ("benchmarks", "experiments", "experiments/mix_sweep"))


@pytest.mark.parametrize("path", MODULES, ids=_id)
def test_module_imports_and_the_names_it_imports_exist(path: Path) -> None:
    module = importlib.import_module(_module_name(path))
    if not path.name.startswith("_"):
        assert callable(getattr(module, "main", None)), f"{_id(path)} has no main()"
    assert not _sibling_imports(path), f"{_id(path)} imports a sibling by its file name: {_sibling_imports(path)}"
    missing = []
    for line, mod_name, name in _package_imports(path):
        mod = importlib.import_module(mod_name)
        if name is not None and not hasattr(mod, name):
            try:  # `from ctxext.pkg import submodule`
                importlib.import_module(f"{mod_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"line {line}: from {mod_name} import {name}")
    assert not missing, f"{_id(path)} imports names that no longer exist:\n" + "\n".join(missing)
    package = ROOT / "ctxext"
    stale = [
        f"{key} = {value}"
        for key, value in vars(module).items()
        if isinstance(value, Path) and value.is_relative_to(package) and not value.exists()
    ]
    assert not stale, f"{_id(path)} points at paths the package no longer has: {stale}"


def test_the_sibling_check_catches_an_import_by_file_name(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("def f():\n    from train_memory import build_model\n    import methods\n")
    assert _sibling_imports(script) == ["line 2: train_memory", "line 3: methods"]


def _edits_sys_path(tree: ast.AST) -> list[int]:
    """Lines that touch ``sys.path`` (or ``site.addsitedir``): every import must work as ``python -m`` sets it."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and (node.value.id, node.attr) in {("sys", "path"), ("site", "addsitedir")}
    ]


def test_no_file_edits_sys_path() -> None:
    found = {_id(p): lines for p in FILES if (lines := _edits_sys_path(ast.parse(p.read_text(), str(p))))}
    assert not found, f"sys.path edits (run as `python -m PACKAGE.NAME` from the repository root instead): {found}"


def test_the_sys_path_check_catches_an_edit() -> None:
    tree = ast.parse("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path(__file__).parent))\n")
    assert _edits_sys_path(tree) == [3]


# Run in a fresh process from the repository root: each module as `python -m` runs it (runpy, `__main__`),
# with `--help`. One process for all of them: a process per module would cost a Python start-up each.
_HELP_ALL = """
import contextlib, io, json, runpy, sys
results = {}
for name in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        code = "returned without exiting"
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # reported, not raised: the test lists every module that fails
        code = repr(exc)
    results[name] = [code, out.getvalue()]
print(json.dumps(results))
"""


def _options(path: Path) -> set[str]:
    """The visible ``--flags`` a module's parser declares (``help=argparse.SUPPRESS`` ones left out)."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            hidden = any(
                k.arg == "help" and isinstance(k.value, ast.Attribute) and k.value.attr == "SUPPRESS"
                for k in node.keywords
            )
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            flags |= {n for n in names if n.startswith("--") and not hidden}
    return flags


def test_every_module_runs_as_python_m_with_help_listing_its_options() -> None:
    names = [_module_name(p) for p in RUNNABLE]
    done = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, *names], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {name: code for name, (code, _) in results.items() if code != 0}
    assert not failed, f"`python -m NAME --help` did not exit 0: {failed}"
    for path in RUNNABLE:
        name = _module_name(path)
        text = results[name][1]
        assert text.startswith(f"usage: python -m {name}"), f"{name}: its usage line names another command"
        absent = sorted(flag for flag in _options(path) if not re.search(rf"(?<![\w-]){re.escape(flag)}\b", text))
        assert not absent, f"{name} --help does not list {absent}"


@pytest.mark.parametrize("path", RUNNABLE, ids=_id)
def test_main_takes_argv_and_silences_third_party_noise_first(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    # main(argv): the flags can be passed in, as the --help check does.
    assert [a.arg for a in main.args.args] == ["argv"], f"{_id(path)}: main() takes no argv"
    # The CLI's silencer, before the script parses arguments or loads a library: otherwise transformers'
    # advisory notes and progress bars bury the numbers the script prints.
    body = [
        s for s in main.body[1 if ast.get_docstring(main) else 0 :] if not isinstance(s, ast.Import | ast.ImportFrom)
    ]
    first = body[0] if body else None
    called = (
        first.value.func.id
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and isinstance(first.value.func, ast.Name)
        else None
    )
    assert called == "quiet_third_party", f"{_id(path)}: main() does not start with quiet_third_party()"


def test_grow_base_measure_only_without_a_model_exits_2(tmp_path, capsys) -> None:
    grow_base = importlib.import_module("benchmarks.grow_base")
    assert grow_base.main(["--measure-only", "--out", str(tmp_path / "none")]) == 2
    assert "no saved model" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_mcnemar_keeps_the_benchmarks_keys() -> None:
    common = importlib.import_module("benchmarks._common")
    # 6 trials only this model gets right, 1 only the reference: p = 2 * P(X <= 1 | n=7, 1/2) = 16/128.
    a = [1] * 6 + [0] + [1, 0, 1]
    b = [0] * 6 + [1] + [1, 0, 1]
    assert common.mcnemar_vs_reference(a, b) == {"only_this": 6, "only_reference": 1, "p_value": 0.125}


def test_a_sweep_arm_refuses_overrides_that_are_not_a_json_object(capsys) -> None:
    arm = importlib.import_module("experiments.mix_sweep.arm")
    for bad in ("{steps: 240}", "[1, 2]"):
        with pytest.raises(SystemExit) as info:
            arm.main(["A", bad])
        assert info.value.code == 2
        assert "overrides" in capsys.readouterr().err


def test_transfer_seeds_ask_fresh_prompts() -> None:
    # The reading's target is ctxext's own (ctxext.evaluation.target: tests/unit/evaluation/test_target.py).
    run = importlib.import_module("experiments.transfer.run")
    # Every training seed's prompts are fresh: no two seeds share a prompt seed.
    assert len({run.prompt_seed(s) for s in range(10)}) == 10
    assert run.base_name("builtin:grown-code-64") == "grown-code-64"


@pytest.mark.parametrize(
    ("holder", "patience", "extends"),
    [(None, 60.0, True), ("live", 60.0, False), ("live", 0.0, True), ("gone", 60.0, True)],
)
def test_seeds_run_side_by_side_build_the_start_once(tmp_path, monkeypatch, holder, patience, extends) -> None:
    # A run that finds another live run writing the shared start waits for it instead of failing on the folder's
    # lock; with no writer, a writer that is gone, or once its patience is spent, it extends itself.
    import os
    import socket
    import threading

    from ctxext.artifacts.lock import lock_path

    run = importlib.import_module("experiments.transfer.run")
    start = tmp_path / "llama3"
    calls: list[list[str]] = []
    monkeypatch.setattr(run, "_ctxext", lambda args, log: calls.append(args) or 0.0)
    if holder:
        # This process stands in for the live writer; a pid past the kernel's limit for one that is gone.
        pid = os.getpid() if holder == "live" else 2**22 + 1
        lock_path(start).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
        start.mkdir()
        threading.Timer(0.2, lambda: (start / "config.json").write_text("{}")).start()
    run.shared_start("builtin:grown-code-64", 256, start, tmp_path / "commands.log", poll=0.05, patience=patience)
    assert bool(calls) == extends
    if extends:
        assert calls[0][:2] == ["extend", "builtin:grown-code-64"]


def test_the_transfer_reading_times_the_training_steps(tmp_path) -> None:
    read = importlib.import_module("experiments.transfer.read")
    rows = [
        {"step": 1, "tokens_seen": 2048, "tokens_per_sec": 1024.0},
        {"step": 2, "tokens_seen": 4096, "tokens_per_sec": 512.0},
        {"step": 2, "tokens_seen": 4096, "val_loss": 2.0},  # an evaluation line: no step time
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read.steps_seconds(tmp_path) == 6.0


RESULTS = ROOT / "experiments" / "results"


def _transfer_folder(folder: Path) -> None:
    """A transfer folder as experiments.transfer.run leaves it: one seed of the base, the start and arm ``a``."""
    run_dir = folder / "a-s0"
    run_dir.mkdir(parents=True)
    (folder / "a.json").write_text(json.dumps({"arm": "a", "sets": [], "target": 16, "window": 4}))
    probe = {"stopped": "goal", "stop_step": 8, "length": 16, "interval": 4, "trials": 2, "best_step": 8}
    probe |= {"best_rate": 1.0, "seconds": 6.0}
    (run_dir / "run.json").write_text(json.dumps({"probe": probe, "steps": 8}))
    readings = [{"step": 4, "rate": 0.5}, {"step": 8, "rate": 1.0, "by_form": {"0": [1, 1], "1": [1, 1]}}]
    (run_dir / "probe.json").write_text(json.dumps({"readings": readings}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "tokens_seen": 60, "tokens_per_sec": 1.0}) + "\n")
    for model, hits in (("base", 1), ("llama3", 0), ("a", 1)):
        cells = {f"{n}/{d}": [hits, 1] for n in (4, 16) for d in (0, 25, 50, 75, 100)}
        e = {"model": model, "ref": str(run_dir), "seed": 0, "needle": cells, "doc_nll": [1.0, 2.0]}
        (folder / f"eval-{model}-s0.json").write_text(json.dumps(e | {"tokens_per_doc": 4}))


def test_an_archived_transfer_folder_reads_as_the_folder_did(tmp_path) -> None:
    read = importlib.import_module("experiments.transfer.read")
    _transfer_folder(tmp_path / "runs" / "base-x")
    lines = read.read(tmp_path / "runs" / "base-x", "a")
    copy = read.archive(tmp_path / "runs" / "base-x", ["a"], tmp_path / "kept")
    shutil.rmtree(tmp_path / "runs")  # the run folders are gone: the copy alone gives the same reading
    assert read.read(copy, "a") == lines
    seed = next(line for line in lines if line.startswith("- seed 0"))
    assert seed.startswith("- seed 0: stopped at step 8: goal; probe at 16 tokens every 4 steps (2 trials): 50 → 100 %")
    assert "training steps 1 min, probes 0.1 min" in seed
    assert sum(f.stat().st_size for f in copy.iterdir()) < 5000


@pytest.mark.parametrize("page", sorted(RESULTS.glob("transfer-*.md")), ids=lambda p: p.name)
def test_a_transfer_page_is_what_its_archive_reads(page: Path) -> None:
    # A page written from an archive (experiments/results/transfer-runs/) must be what that archive reads today.
    read = importlib.import_module("experiments.transfer.read")
    command = re.search(r"`python -m experiments\.transfer\.read (.+?) --arm (.+?) --page", page.read_text())
    assert command, f"{page.name}: no `python -m experiments.transfer.read ... --arm ... --page` command"
    folders, (arms, _, against) = command.group(1).split(), command.group(2).partition(" --against ")
    assert all(f.startswith("experiments/results/transfer-runs/") for f in folders), f"{page.name}: not archived"
    lines = [line for f in folders for arm in arms.split() for line in read.read(ROOT / f, arm, against.split())]
    body = page.read_text().split("\n")[4:]
    assert body[: len(lines)] == lines, f"{page.name} differs from its archive's reading: rewrite it with its command"


def test_replaying_the_recipes_goal_rule_stops_every_archived_run_where_it_stopped() -> None:
    # The replay (experiments.transfer.goals) judges by the recipe's own rule: on every archived run since the probe
    # counts depths it must find the recorded goal stops and no others, or its other rules' numbers mean nothing.
    goals = importlib.import_module("experiments.transfer.goals")
    checked = 0
    for path in sorted((ROOT / "experiments/results/transfer-runs").glob("*/eval-*-s*.json")):
        run = json.loads(path.read_text()).get("run") or {}
        if not run.get("readings") or "by_depth" not in run["readings"][0]:
            continue
        hit, probe = goals.replay(run, "worst", 0.0), run["probe"]
        assert (hit["step"] if hit else None) == (probe["stop_step"] if probe["stopped"] == "goal" else None), path
        checked += 1
    assert checked >= 50
    # A reading at 31/32 at four depths and 29/32 at one: below the recipe's goal, at the pooled rule's.
    reading = {
        "rate": 153 / 160,
        "score": 29 / 32,
        "by_depth": {"0": [31, 32], "25": [31, 32], "50": [29, 32], "75": [31, 32], "100": [31, 32]},
    }
    from ctxext.training.probe import GOAL_RULES

    worst, pooled = GOAL_RULES["worst"].met, GOAL_RULES["pooled"].met
    assert not worst(reading, 0.95, 0.05) and pooled(reading, 0.95, 0.05)
    assert not pooled(reading, 0.95, 0.03)


def test_the_forms_reading_pairs_models_on_the_same_prompts() -> None:
    forms = importlib.import_module("experiments.transfer.forms")
    depths = forms.DEPTHS
    # Form 0 at 64 tokens: the start retrieves every key, the other model the first half of each depth's.
    start = {f"64/{d}": [1, 1, 1, 1] for d in depths}
    other = {f"64/{d}": [1, 1, 0, 0] for d in depths}
    assert forms._cell(other, 64) == "50 · 50 · 50 · 50 · 50 (50 [30, 70])"
    assert forms._cell(None, 64) == "does not fit"
    results = {"llama3|0|4|7|4x": start, "yarn|0|4|7|4x": other, "llama3|2|4|7|4x": None, "yarn|2|4|7|4x": None}
    opts = argparse.Namespace(against="llama3", forms=[0, 2], trials=4, seed=7, factor=4)
    lines = forms.paired_lines(results, {"base": "b", "llama3": "l", "yarn": "y"}, {"yarn": [64], "llama3": [64]}, opts)
    assert lines[-1] == "- `yarn`, form 0: 64 tokens +0/−10, p = 0.002"  # a form that does not fit is left out


# ---- result pages

CURRENT = [p for p in PAGES if p.parent.name == "results"]
LOGS = [p for p in PAGES if p.parent.name == "log"]
# A command as a page names it: inline or in a code block, perhaps behind `nice` and environment variables.
COMMAND = re.compile(
    r"(?:^|`)(?:[A-Z_]+=\S+ )*(?:nice -n \d+ )?(?:python -m (?:benchmarks|experiments)\.|ctxext )", flags=re.M
)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_there_are_current_pages_and_dated_logs() -> None:
    assert len(CURRENT) >= 10 and len(LOGS) >= 5
    assert all(p.parent.parent.name == "results" for p in LOGS), "logs sit in results/log/"


@pytest.mark.parametrize("path", CURRENT, ids=_id)
def test_a_current_page_starts_with_its_command_and_date(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# "), f"{_id(path)}: no title"
    head = "\n".join(lines[1:14])
    assert re.search(r"\bCommands?\b", head) and COMMAND.search(head), (
        f"{_id(path)}: the first lines do not name the command that regenerates the page"
    )
    assert DATE.search(head), f"{_id(path)}: the first lines do not say when it was measured"


@pytest.mark.parametrize("path", LOGS, ids=_id)
def test_a_log_is_named_by_its_date_and_topic(path: Path) -> None:
    assert re.fullmatch(r"20\d\d-\d\d-\d\d-[a-z0-9-]+\.md", path.name), f"{_id(path)}: not YYYY-MM-DD-topic.md"
    assert path.read_text().startswith("# "), f"{_id(path)}: no title"


def test_every_current_page_is_listed_in_its_readme() -> None:
    for package in PACKAGES:
        readme = (ROOT / package / "README.md").read_text()
        pages = [p for p in CURRENT if p.is_relative_to(ROOT / package)]
        unlisted = [_id(p) for p in pages if f"(results/{p.name})" not in readme]
        assert not unlisted, f"{package}/README.md does not list {unlisted}"


@pytest.mark.parametrize("path", PAGES, ids=_id)
def test_relative_links_of_a_page_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # commands in code blocks are not links
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:|#", t)]
    missing = [t for t in relative if not (path.parent / t).exists()]
    assert not missing, f"{_id(path)} links to files that do not exist: {missing}"


STALE = re.compile(r"python3? (?:\S*/)?benchmarks/\w+\.py|benchmarks/mix_sweep")


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *PAGES, *FILES], ids=_id)
def test_no_page_runs_a_benchmark_by_its_file_path(path: Path) -> None:
    stale = sorted({m.group(0) for m in STALE.finditer(path.read_text())})
    assert not stale, f"{_id(path)}: run benchmarks and experiments as `python -m PACKAGE.NAME`, not {stale}"
