"""Architecture rules that a refactor could silently break: the import layering and a light CLI import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ctxext"

# The layers (docs/design.md). Core: one concept each, no workflow. Orchestration: the only modules that
# chain workflows and talk to the terminal. Everything else is a workflow.
CORE = {
    "errors",
    "console",
    "atomic",
    "builtin",
    "sources",
    "rope",
    "rope_types",
    "rope_methods",
    "weights",
    "verify",
    "config",
    "pose",
    "rows",
    "data",
    "data_sources",
    "mixture",
    "losses",
    "model",
    "runfolder",
    "devices",
    "footprint",
    "tasks",
    "search.budget",  # a duration parser the recipe schema validates with; imports nothing of ctxext
    "evaluation.metrics",
    "evaluation.schema",  # the report schema: read by runfolder (core), written by the evaluator
}
ORCHESTRATION = {"cli", "__main__", "evaluation.cli", "demo", "rope_flags"}


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
    def within(group: set[str]) -> bool:
        return any(name == g or name.startswith(g + ".") for g in group)

    return 0 if within(CORE) else 2 if within(ORCHESTRATION) else 1


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
        "import sys, ctxext, ctxext.cli\n"
        "from typer.testing import CliRunner\n"
        "assert CliRunner().invoke(ctxext.cli.app, ['--help']).exit_code == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
