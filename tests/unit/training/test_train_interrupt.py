"""Training interrupted, moved, damaged or pointed at other base weights: clear messages, nothing lost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import ctxext.training.loop as loop_module
import ctxext.training.run as train_module
from ctxext.artifacts.run import read_run
from ctxext.errors import CtxextError, InputError
from ctxext.models.weights import fingerprint
from ctxext.recipe.schema import load_recipe
from tests.helpers.train import write_recipe


@pytest.fixture()
def base_copy(tmp_path, cache_root):
    from ctxext.models.sources import resolve_model_path

    dest = tmp_path / "base"
    shutil.copytree(resolve_model_path("builtin:tiny-llama"), dest)
    return dest


def test_interrupt_move_damage_and_changed_base(tmp_path, base_copy, monkeypatch):
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml",
            tmp_path / "run",
            model={"path": str(base_copy)},
            train={"max_steps": 4, "save_every": 1, "micro_batch_size": 1},
            data={"max_documents": 6, "validation_fraction": 0},
        )
    )
    calls = {"n": 0}
    real = loop_module.build_inputs

    def interrupt_at_step_3(*args, **kwargs):  # Ctrl-C while the third step's batch is built
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "build_inputs", interrupt_at_step_3)
    with pytest.raises(CtxextError) as err:
        train_module.train(recipe)
    monkeypatch.setattr(loop_module, "build_inputs", real)
    message = str(err.value)
    assert err.value.exit_code == 130
    assert "interrupted at step 2 of 4" in message and "step-0000002 (step 2)" in message
    assert f"output.dir={tmp_path / 'run'} --resume" in message
    info = read_run(tmp_path / "run", allow_incomplete=True)
    assert info.status == "interrupted" and info.steps == 2
    assert info.base_fingerprint == fingerprint(base_copy)

    # Moved: the run resumes from its new place (its recipe.yaml still names the old one).
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    (tmp_path / "run").rename(moved)
    resumed_recipe = load_recipe(moved / "recipe.yaml", [f"output.dir={moved}"])

    # A damaged latest checkpoint is named, with the way out.
    weights = next((moved / "checkpoints" / "step-0000002").glob("*.safetensors"))
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 3])
    with pytest.raises(InputError, match=r"checkpoint .*step-0000002 cannot be loaded.*step-0000001"):
        train_module.train(resumed_recipe, resume=True)
    weights.write_bytes(good)

    # Other base weights under the same path: refused before anything is loaded.
    from safetensors.torch import load_file, save_file

    base_weights = base_copy / "model.safetensors"
    original = base_weights.read_bytes()
    tensors = load_file(base_weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, base_weights, metadata={"format": "pt"})
    with pytest.raises(InputError, match="not the ones this run was trained on"):
        train_module.train(resumed_recipe, resume=True)
    base_weights.write_bytes(original)

    # Trained on another number of processes: refused before anything is loaded (the rows each process reads,
    # the batch of a step and the saved random states are per process).
    run_file = moved / "run.json"
    saved_run = run_file.read_text()
    run_file.write_text(json.dumps({**json.loads(saved_run), "num_processes": 2}))
    with pytest.raises(InputError, match=r"--resume: the run was trained on 2 process\(es\) and this launch has 1"):
        train_module.train(resumed_recipe, resume=True)
    run_file.write_text(saved_run)

    result = train_module.train(resumed_recipe, resume=True)
    info = json.loads((moved / "run.json").read_text())
    assert info["status"] == "complete" and info["steps"] == 4
    assert info["topology"]["world_size"] == info["topology"]["nodes"] == 1
    assert result.run_dir == moved
    assert torch.isfinite(torch.tensor(info["final_train_loss"]))


@pytest.mark.slow
def test_sigterm_stops_at_a_step_with_a_checkpoint_and_the_printed_command_resumes(tmp_path, base_copy):
    """What a scheduler sends before it kills a job: the run stops cleanly, even in a folder with spaces."""
    import re
    import shlex
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.train import ROOT, env

    out = tmp_path / "my runs" / "run 1"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        out,
        model={"path": str(base_copy)},
        train={"max_steps": 12, "micro_batch_size": 1, "log_every": 1},  # no save_every: SIGTERM saves
        data={"max_documents": 6, "validation_fraction": 0},
    )
    cmd = [sys.executable, "-m", "ctxext", "train", str(recipe)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.is_file() and metrics.read_text().strip()) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    message = " ".join(err.split())
    assert proc.returncode == 143, err
    found = re.search(r"stopped by SIGTERM at step (\d+) of 12; the last checkpoint is (.+?) \(step (\d+)\)", message)
    assert found, message
    step = int(found.group(1))
    assert 1 <= step < 12 and int(found.group(3)) == step
    assert found.group(2) == str(out / "checkpoints" / f"step-{step:07d}") and Path(found.group(2)).is_dir()
    info = read_run(out, allow_incomplete=True)
    assert info.status == "interrupted" and info.steps == step and info.error == "SIGTERM"
    assert "Traceback" not in err

    # The printed command is shell-quoted: pasted as is, it resumes the run in the folder with spaces.
    resume = re.search(r"Continue with `([^`]+)`", message)
    assert resume, message
    argv = shlex.split(resume.group(1))
    assert argv == ["ctxext", "train", str(out / "recipe.yaml"), f"output.dir={out}", "--resume"]
    done = subprocess.run(
        [sys.executable, "-m", "ctxext", *argv[1:]], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    info = read_run(out)
    assert info.status == "complete" and info.steps == 12
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 13))
