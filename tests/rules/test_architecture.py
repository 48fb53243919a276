"""Architecture rules that a refactor could silently break: the import layering, a light CLI import, and tests
that mirror the package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "ctxext"

# The layers (docs/design.md), one per folder. Core: one concept each, no workflow. Orchestration: the only
# package that chains workflows and talks to the terminal. Workflows: one job each.
CORE = {"errors", "atomic", "progress", "resources", "rope", "recipe", "tasks", "scoring", "artifacts", "models"}
WORKFLOWS = {"extend", "training", "evaluation", "calibration", "search", "planner", "publish"}
ORCHESTRATION = {"cli", "__main__"}
# The package itself (its lazy public-name table) is the only module outside every layer.
TOP_FILES = {"__init__.py", "__main__.py", "errors.py", "atomic.py", "progress.py", "py.typed"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every ctxext module each module imports, at top level or inside functions (lazy imports count too)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ctxext"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                short = t.removeprefix("ctxext").lstrip(".")
                if t.startswith("ctxext") and short in mods and short != name:
                    found.add(short)
        graph[name] = found
    return graph


def _layer(name: str) -> int:
    if not name:  # `from ctxext import __version__`: the package's own leaf names
        return 0
    top = name.split(".")[0]
    for layer, group in enumerate((CORE, WORKFLOWS, ORCHESTRATION)):
        if top in group:
            return layer
    raise AssertionError(f"ctxext.{name} is in no layer: add its folder to CORE, WORKFLOWS or ORCHESTRATION")


def test_imports_only_go_down_the_layers() -> None:
    mods = _modules()
    graph = _imports(mods)
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in graph.items()
        for b in targets
        if a and _layer(b) > _layer(a)
    ]
    assert not upward, "imports that go up a layer:\n" + "\n".join(sorted(upward))


# Imports from one workflow folder into another that remain to be moved into core (each entry names its way out).
WORKFLOW_IMPORTS_TO_REMOVE: set[tuple[str, str]] = set()


def test_no_workflow_imports_another_workflow() -> None:
    # What two workflows share is core (scoring, models, tasks ...); only the CLI chains workflows.
    graph = _imports(_modules())
    crossing = {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if a.split(".")[0] in WORKFLOWS and b.split(".")[0] in WORKFLOWS and a.split(".")[0] != b.split(".")[0]
    }
    found = {(a, ".".join(b.split(".")[:2])) for a, b in crossing}
    assert found <= WORKFLOW_IMPORTS_TO_REMOVE, "workflow imports another workflow:\n" + "\n".join(
        f"{a} -> {b}" for a, b in sorted(found - WORKFLOW_IMPORTS_TO_REMOVE)
    )


def test_one_place_builds_a_causal_lm_from_a_folder() -> None:
    # One loader (ctxext.models.load on ctxext.models.build): the places that call a transformers
    # *ForCausalLM.from_pretrained are where built-ins, GGUF, adapters and the RoPE check are resolved.
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id.endswith("ForCausalLM")
            ):
                callers.add(path.relative_to(PACKAGE).as_posix())
    assert len(callers) <= 2, f"*ForCausalLM.from_pretrained called in {sorted(callers)}: load through ctxext.models"


def test_no_import_cycles() -> None:
    graph = _imports(_modules())
    graph.pop("", None)  # the package's lazy __getattr__ table is not an import edge
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cli_import_and_help_do_not_import_torch() -> None:
    # `ctxext --help` pays for every module the CLI imports at top level; torch alone costs seconds.
    code = (
        "import sys, ctxext, ctxext.cli.commands\n"
        "from typer.testing import CliRunner\n"
        "assert CliRunner().invoke(ctxext.cli.commands.app, ['--help']).exit_code == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_folder_is_in_one_layer_and_the_top_level_is_small() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == (CORE | WORKFLOWS | ORCHESTRATION) - {"errors", "atomic", "progress", "__main__"}, folders
    files = {p.name for p in PACKAGE.iterdir() if p.is_file()}
    assert files <= TOP_FILES, f"modules directly in ctxext/ beyond the leaves: {sorted(files - TOP_FILES)}"


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, less its docstring (the rule limits code, not documentation)."""
    lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1  # type: ignore[operator]
    return lines


def test_modules_and_functions_stay_small() -> None:
    # Split along concepts when a module or function outgrows these (docs/development.md).
    too_long: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {n} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := _function_lines(node)) > MAX_FUNCTION_LINES:
                    too_long.append(f"{rel}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "too long:\n" + "\n".join(too_long)


def test_the_size_check_counts_lines_as_documented() -> None:
    # The rule excludes a docstring, not comments or code: a function of 81 code lines fails it.
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    tree = ast.parse(f'def f():\n    """Doc.\n\n    More.\n    """\n{body}')
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert _function_lines(fn) == 81  # the def line + 80 statements; the 4-line docstring is not counted


TESTS = ROOT / "tests"
TEST_FOLDERS = {"unit", "integration", "rules"}  # beside them: helpers/ (a package), data/, conftest.py


def test_the_tests_mirror_the_package() -> None:
    # tests/unit/<package>/ per folder of ctxext (resources holds data only), nothing else under tests/unit/;
    # whole journeys in tests/integration/ (marked slow by conftest.py), rules in tests/rules/.
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files directly in tests/ (move each under {sorted(TEST_FOLDERS)}): {loose}"
    unit = {p.name for p in (TESTS / "unit").iterdir() if p.is_dir() and p.name != "__pycache__"}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"resources"}
    assert unit == packages, (
        f"tests/unit/ folders without a package: {sorted(unit - packages)}; "
        f"packages without tests/unit/<package>/: {sorted(packages - unit)}"
    )
    empty = sorted(name for name in unit if not any((TESTS / "unit" / name).glob("test_*.py")))
    assert not empty, f"tests/unit/<package>/ folders without a test: {empty}"
    stray = sorted(
        p.relative_to(TESTS).as_posix()
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in TEST_FOLDERS
    )
    assert not stray, f"test files outside {sorted(TEST_FOLDERS)}: {stray}"
