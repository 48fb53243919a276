"""A full disk: one message, exit code 2, no partial output left; a training run stays resumable.

The real cases write to a small tmpfs (mounting one needs root; they are skipped elsewhere, with that
reason). The atomic writer's rule is also checked without a mount, with the write raising ENOSPC.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.artifacts.lock import lock_path
from ctxext.atomic import OUTPUT_MARKER, atomic_folder
from ctxext.cli.commands import app
from ctxext.errors import InputError, is_disk_full
from tests.helpers.train import ROOT, env, write_recipe

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


def _fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` until the file system refuses (what another job writing logs does), then free ``leave`` bytes."""
    filler = disk / "filler.bin"
    with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to flush (and fail) on close
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
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


# Every other writing command, run onto a disk that is already full (another job's logs filled it), or with room
# for a few small files only: `{disk}` is that disk, `{run}` a trained run (`{run_on_disk}`: a copy of it on the
# disk), `{model}` the tiny model. The last argument on the disk is the output each message must name.
FULL_DISK_CASES = {
    "eval ppl": ["eval", "ppl", "--model", "{model}", "--lengths", "32", "--data", "{text}", "--min-docs", "1",
                 "--resamples", "10", "--no-short-context", "-q", "--out", "{disk}/report"],
    "merge": ["merge", "{run}", "--out", "{disk}/merged", "--smoke-length", "64", "--sequences", "1"],
    "export": ["export", "{run}", "--for", "vllm", "--out", "{disk}/served"],
    "search": ["search", "{model}", "-t", "512", "--out", "{disk}/searched", "--generations", "1", "--population", "4",
               "--objective", "far-ppl", "--samples", "8", "--no-report"],
    "tasks export": ["tasks", "export", "{disk}/tasks", "--model", "{model}", "--tasks", "passkey", "--lengths", "256",
                     "--trials", "20", "--depths", "50"],
    "push staging": ["push", "{run_on_disk}", "--repo-id", "me/x", "--dry-run"],
    "calibrate": ["calibrate", "{run_on_disk}", "--data", "{text}", "--temperatures", "1.2", "--trials", "2",
                  "--window-trials", "1", "--depths", "0,100", "--windows", "2"],
}  # fmt: skip


@pytest.mark.parametrize("room", [0, 16 * 1024], ids=["full", "16k-free"])
@pytest.mark.parametrize("case", list(FULL_DISK_CASES))
def test_every_writing_command_on_a_full_disk(case, room, small_disk, tmp_path_factory, tiny_model_dir, tmp_path):
    from tests.helpers.hub import copy_run, shared_run

    text = tmp_path / "doc.txt"
    text.write_text(" ".join(f"line {i} of a plain document" for i in range(400)))
    disk = small_disk("4m")  # above the 1 MiB under which any failed write counts as a full disk
    values: dict[str, Path] = {"model": tiny_model_dir, "text": text, "disk": disk}
    if "{run" in " ".join(FULL_DISK_CASES[case]):
        values["run"] = shared_run(tmp_path_factory, tiny_model_dir)
        values["run_on_disk"] = copy_run(values["run"], disk / "run")
    before = sorted(disk.rglob("*"))
    filler = _fill(disk, leave=room)
    args = [a.format(**values) for a in FULL_DISK_CASES[case]]
    result = runner.invoke(app, args)
    if room and case == "calibrate":
        # calibration.json is a few kB: it fits, written whole, with no temporary file beside it.
        assert result.exit_code == 0, result.output
        assert json.loads((values["run_on_disk"] / "calibration.json").read_text())["attention_temperature"] == 1.0
        assert not [p for p in disk.rglob(".*") if p.name != OUTPUT_MARKER], list(disk.rglob(".*"))
        return
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    out = Path([a for a in args if a.startswith(str(disk))][-1])
    out = out / "hub" if case == "push staging" else out  # push stages the card and files in RUN/hub
    assert f"{out}: the disk filled up" in flat(result.output), result.output
    if "--resume" not in result.output:
        # No partial folder, no temporary sibling, no lock; what was on the disk before is all that is there.
        assert sorted(disk.rglob("*")) == sorted([*before, filler])
        return
    # A search that had begun keeps its log and says so; once there is room, --resume finishes it.
    assert case == "search" and (out / "search.jsonl").is_file() and not lock_path(out).exists()
    filler.unlink()
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert (out / "config.json").is_file()
