"""Every benchmark script still imports, and every ``ctxext`` name it imports (lazily too) still exists.

The benchmarks import most of ctxext inside their functions, so that ``--help`` is fast; a rename in
the package would break them only when someone runs them, months later. Here each ``benchmarks/**/*.py``
is executed as a module (without running ``main``), the way ``python benchmarks/X.py`` would see it
(its own folder first on ``sys.path``), each ``from ctxext… import name`` anywhere in it is resolved, and
each module-level path into the package must exist.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.rglob("*.py"))


def _id(path: Path) -> str:
    return path.relative_to(BENCHMARKS).as_posix()


def _load(path: Path, monkeypatch: pytest.MonkeyPatch):
    # As `python benchmarks/X.py` runs it: its folder first on sys.path (sibling imports such as `_memory`).
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(path.parent))
    name = "benchmark_" + "_".join(path.relative_to(BENCHMARKS).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses look their module up in sys.modules.
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def _ctxext_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` of every import of ctxext in the file, inside functions too."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ctxext":
            found += [(node.lineno, node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "ctxext"]
    return found


def test_every_benchmark_is_collected() -> None:
    names = {_id(p) for p in SCRIPTS}
    assert {"grow_base.py", "finetune_mix.py", "_common.py", "mix_sweep/qeval.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=_id)
def test_benchmark_imports_and_its_ctxext_names_exist(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(path, monkeypatch)
    if not path.name.startswith("_"):
        assert callable(getattr(module, "main", None)), f"{_id(path)} has no main()"
    missing = []
    for line, mod_name, name in _ctxext_imports(path):
        mod = importlib.import_module(mod_name)
        if name is not None and not hasattr(mod, name):
            try:  # `from ctxext.pkg import submodule`
                importlib.import_module(f"{mod_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"line {line}: from {mod_name} import {name}")
    assert not missing, f"{_id(path)} imports names ctxext no longer has:\n" + "\n".join(missing)
    package = ROOT / "ctxext"
    stale = [
        f"{key} = {value}"
        for key, value in vars(module).items()
        if isinstance(value, Path) and value.is_relative_to(package) and not value.exists()
    ]
    assert not stale, f"{_id(path)} points at paths the package no longer has: {stale}"


def test_grow_base_measure_only_without_a_model_exits_2(monkeypatch, tmp_path, capsys) -> None:
    grow_base = _load(BENCHMARKS / "grow_base.py", monkeypatch)
    assert grow_base.main(["--measure-only", "--out", str(tmp_path / "none")]) == 2
    assert "no saved model" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_mcnemar_keeps_the_benchmarks_keys(monkeypatch) -> None:
    common = _load(BENCHMARKS / "_common.py", monkeypatch)
    # 6 trials only this model gets right, 1 only the reference: p = 2 * P(X <= 1 | n=7, 1/2) = 16/128.
    a = [1] * 6 + [0] + [1, 0, 1]
    b = [0] * 6 + [1] + [1, 0, 1]
    assert common.mcnemar_vs_reference(a, b) == {"only_this": 6, "only_reference": 1, "p_value": 0.125}


def _first_call(main: ast.FunctionDef) -> str | None:
    """The function the first statement of ``main`` calls, its docstring and imports skipped."""
    body = [
        s for s in main.body[1 if ast.get_docstring(main) else 0 :] if not isinstance(s, ast.Import | ast.ImportFrom)
    ]
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call) and isinstance(first.value.func, ast.Name):
        return first.value.func.id
    return None


@pytest.mark.parametrize("path", [p for p in SCRIPTS if not p.name.startswith("_")], ids=_id)
def test_benchmark_silences_third_party_noise_first(path: Path) -> None:
    # The CLI's silencer, before the script parses arguments or loads a library: otherwise transformers'
    # advisory notes and progress bars bury the numbers the script prints.
    tree = ast.parse(path.read_text(), str(path))
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert _first_call(main) == "quiet_third_party", (
        f"{_id(path)}: main() does not start with quiet_third_party() (from ctxext.cli.quiet)"
    )
