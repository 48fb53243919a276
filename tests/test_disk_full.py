"""A full disk: one message, exit code 2, no partial output left; a training run stays resumable.

The real cases write to a small tmpfs (mounting one needs root; they are skipped elsewhere, with that
reason). The atomic writer's rule is also checked without a mount, with the write raising ENOSPC.
"""

from __future__ import annotations

import errno
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _train_helpers import ROOT, env, write_recipe
from typer.testing import CliRunner

from ctxext.artifacts.lock import lock_path
from ctxext.atomic import OUTPUT_MARKER, atomic_folder, is_disk_full
from ctxext.cli.commands import app
from ctxext.errors import InputError

runner = CliRunner()


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture()
def small_disk(tmp_path) -> Iterator[Callable[[str], Path]]:
    """Mount a tmpfs of the given size (``512k``, ``8m``) under ``tmp_path``; unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk-{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_atomic_writer_turns_enospc_into_one_message_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "report"
    with atomic_folder(out, kind="report") as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(InputError, match=r"the disk filled up while writing \(No space left on device\)"):
        with atomic_folder(out, kind="report", overwrite=True) as tmp:
            (tmp / "b.txt").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "a.txt"]  # the previous output is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary folder, no lock file
    # Libraries that wrap the OS error (safetensors' writer) are recognised by their message.
    wrapped = RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No sp…" })')
    assert is_disk_full(wrapped) and is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


def test_extend_onto_a_full_disk(small_disk, tiny_model_dir):
    disk = small_disk("512k")  # smaller than the tiny model's weights (~630 KB, copied across file systems)
    out = disk / "ext"
    result = runner.invoke(app, ["extend", str(tiny_model_dir), "-m", "linear", "-t", "1024", "-o", str(out)])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"--out {out}: the disk filled up while writing (No space left on device)" in text
    assert "Traceback" not in result.output
    assert list(disk.iterdir()) == []  # no partial folder, no temporary sibling, no lock
    assert not lock_path(out).exists()


def _fill(disk: Path) -> Path:
    """Fill ``disk`` until the file system refuses (what another job writing logs does)."""
    filler = disk / "filler.bin"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


@pytest.mark.slow
def test_training_on_a_disk_that_fills_up_stays_resumable(small_disk, tmp_path, tiny_model_dir):
    disk = small_disk("16m")
    out = disk / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        out,
        model={"path": str(tiny_model_dir)},
        train={"max_steps": 10, "micro_batch_size": 1, "log_every": 1, "save_every": 1},
        data={"max_documents": 6, "validation_fraction": 0},
    )
    cmd = [sys.executable, "-m", "ctxext", "train", str(recipe)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.is_file() and metrics.read_text().strip()) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    filler = _fill(disk)
    _, err = proc.communicate(timeout=300)
    message = flat(err)
    assert proc.returncode == 2, err
    assert f"output.dir {out}: the disk filled up at step" in message and "Traceback" not in err
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "interrupted" and info["error"] == "disk full"
    assert not list((out / "checkpoints").glob(".tmp-*"))  # no half checkpoint that looks like the newest
    assert not lock_path(out).exists()

    # Space freed, the printed command finishes the run.
    filler.unlink()
    resume = re.search(r"continue with `([^`]+)`", message)
    assert resume, message
    argv = shlex.split(resume.group(1))
    done = subprocess.run(
        [sys.executable, "-m", "ctxext", *argv[1:]], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["steps"] == 10
