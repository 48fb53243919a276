"""The real-model benchmark's store: two runs of it sharing one results file keep each other's cells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import benchmarks.real_model as bench


def test_a_save_keeps_what_another_run_stored_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "JSON_FILE", tmp_path / "real_model.json")
    fine_tune = bench._read()  # a long run loads the store at its start ...
    probe = bench._read()  # ... a second run starts beside it
    stages = probe["stages"]  # held across saves, as the probe's loop holds it
    stages["in-window icl"] = {"correct": 3, "samples": 12}
    bench._save(probe)
    stages["in-window doc_qa"] = {"correct": 0, "samples": 12}
    bench._save(probe)
    fine_tune["cells"]["finetuned@8192:keys"] = {"outcomes": [1, 0]}
    bench._save(fine_tune)  # written from a copy that never saw the probe's stage
    stored = json.loads((tmp_path / "real_model.json").read_text())
    assert stored["stages"] == {
        "in-window icl": {"correct": 3, "samples": 12},
        "in-window doc_qa": {"correct": 0, "samples": 12},
    }
    assert stored["cells"] == {"finetuned@8192:keys": {"outcomes": [1, 0]}}


def test_a_probe_spec_is_a_task_and_its_integer_options() -> None:
    assert bench.probe_spec("json_kv") == ("json_kv", {})
    assert bench.probe_spec("doc_qa:docs=2,x=3") == ("doc_qa", {"docs": 2, "x": 3})
    with pytest.raises(SystemExit, match="NAME=INTEGER"):
        bench.probe_spec("json_kv:hex=many")
