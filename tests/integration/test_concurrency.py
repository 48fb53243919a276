"""One writer per output folder: a second writer is refused before any work, a dead writer's lock is cleared.

The holder is always a real second process: a Python process holding the folder's lock (what every
writer does while it works), or a real concurrent ``ctxext train``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.artifacts.lock import folder_lock, lock_path
from ctxext.cli.commands import app
from ctxext.errors import InputError
from tests.helpers.train import ROOT, env, write_recipe

runner = CliRunner()

HOLDER = (
    "import sys\n"
    "from ctxext.artifacts.lock import folder_lock\n"
    "with folder_lock(sys.argv[1], command='ctxext holder-test'):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.readline()\n"
)


def flat(text: str) -> str:
    return " ".join(text.split())


class Holder:
    """A real second process that holds the lock of ``folder`` until it is released or killed."""

    def __init__(self, folder: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env(PYTHONPATH=str(ROOT)),
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=60) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)


@pytest.fixture()
def holder() -> Iterator[Callable[[Path], Holder]]:
    made: list[Holder] = []

    def make(folder: Path) -> Holder:
        h = Holder(folder)
        made.append(h)
        return h

    yield make
    for h in made:
        if h.proc.poll() is None:
            h.kill()


def test_lock_refuses_a_second_process_and_is_released(tmp_path, holder):
    out = tmp_path / "out"
    h = holder(out)
    with pytest.raises(InputError) as err:
        with folder_lock(out, flag="--out"):
            pass
    message = flat(str(err.value))
    assert f"pid {h.proc.pid} on host {socket.gethostname()}" in message and "ctxext holder-test" in message
    assert "Nothing was done" in message and "choose another --out" in message
    h.release()
    assert not lock_path(out).exists()
    # Re-entrant within a process; released when the outer block ends, also on an exception.
    with pytest.raises(RuntimeError):
        with folder_lock(out), folder_lock(out):
            assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
            raise RuntimeError("boom")
    assert not lock_path(out).exists()


def test_stale_lock_is_cleared_with_a_note_and_a_remote_one_is_not(tmp_path, holder, tiny_model_dir):
    out = tmp_path / "ext"
    holder(out).kill()  # SIGKILL: no cleanup ran, the lock file stays
    assert lock_path(out).is_file()
    result = runner.invoke(app, ["extend", str(tiny_model_dir), "-m", "linear", "-t", "1024", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "cleared the stale lock" in flat(result.output) and "no longer running" in flat(result.output)
    assert (out / "config.json").is_file() and not lock_path(out).exists()

    # A lock taken on another machine (a shared file system) cannot be checked: refused, with the file to delete.
    other = tmp_path / "other"
    lock_path(other).write_text(json.dumps({"pid": 1, "host": "gpu-node-7", "started": "2026-12-01 10:00:00 UTC"}))
    result = runner.invoke(app, ["extend", str(tiny_model_dir), "-m", "linear", "-t", "1024", "-o", str(other)])
    assert result.exit_code == 2, result.output
    assert "gpu-node-7" in flat(result.output) and f"delete {lock_path(other)}" in flat(result.output)
    assert not other.exists() and "Traceback" not in result.output


def _write_run_stub(run_dir: Path, base: Path) -> None:
    """What the merge command reads before it locks (nothing here is trained: merge is refused first)."""
    run_dir.mkdir(parents=True)
    run_dir.joinpath("run.json").write_text(
        json.dumps({"status": "complete", "base_model": str(base), "method": "yarn", "target_length": 1024})
    )
    run_dir.joinpath("adapter_config.json").write_text("{}")


def test_every_writer_is_refused_before_any_work(tmp_path, holder, tiny_model_dir):
    data = tmp_path / "doc.txt"
    data.write_text((ROOT / "ctxext" / "atomic.py").read_text() * 4)
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", model={"path": str(tiny_model_dir)})
    run_dir = tmp_path / "finished"
    _write_run_stub(run_dir, tiny_model_dir)
    model = str(tiny_model_dir)
    commands = {
        "extend": (["extend", model, "-m", "yarn", "-t", "1024", "-o", "{out}"], "--out"),
        "search": (["search", model, "-t", "1024", "--out", "{out}", "--budget", "5s"], "--out"),
        "eval ppl": (["eval", "ppl", "--model", model, "--data", str(data), "--lengths", "32", "-o", "{out}"], "--out"),
        "eval run": (["eval", "run", str(ROOT / "eval" / "tiny-cpu.yaml"), "--model", model, "-o", "{out}"], "--out"),
        "merge": (["merge", str(run_dir), "--out", "{out}"], "--out"),
        "train": (["train", str(recipe), "output.dir={out}"], "output.dir"),
        "train --resume": (["train", str(recipe), "output.dir={out}", "--resume"], "output.dir"),
    }
    for name, (args, flag) in commands.items():
        out = tmp_path / name.replace(" ", "-")
        if name == "train --resume":  # a run in progress: its folder exists, its writer holds the lock
            out.mkdir()
            (out / "run.json").write_text(json.dumps({"status": "running"}))
        h = holder(out)
        before = sorted(p.name for p in tmp_path.iterdir())
        result = runner.invoke(app, [a.replace("{out}", str(out)) for a in args])
        text = flat(result.output)
        assert result.exit_code == 2, (name, result.output)
        assert f"{flag} {out}: another ctxext command is writing there (pid {h.proc.pid}" in text, (name, text)
        assert "Traceback" not in result.output
        # Nothing was written: no output, no temporary sibling, the holder's lock untouched.
        assert sorted(p.name for p in tmp_path.iterdir()) == before, name
        assert json.loads(lock_path(out).read_text())["pid"] == h.proc.pid
        h.release()


def test_push_staging_is_locked(tmp_path, holder):
    from ctxext.atomic import atomic_folder

    staging = tmp_path / "run" / "hub"
    h = holder(staging)
    with pytest.raises(InputError, match=f"staging folder {staging}: another ctxext command.*pid {h.proc.pid}"):
        with atomic_folder(staging, kind="hub-staging", overwrite=True, flag="staging folder"):
            raise AssertionError("the block must not run")
    assert not staging.exists()


@pytest.mark.slow
def test_two_concurrent_trainings_into_one_folder(tmp_path, tiny_model_dir):
    """Two real `ctxext train` processes started together: exactly one trains, the other is refused."""
    out = tmp_path / "run"
    recipe = write_recipe(
        tmp_path / "r.yaml",
        out,
        model={"path": str(tiny_model_dir)},
        train={"max_steps": 3, "log_every": 1},
        data={"max_documents": 6},
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ctxext", "train", str(recipe), f"train.seed={seed}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(PYTHONPATH=str(ROOT)),
        )
        for seed in (1, 2)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    winner = next(i for i, r in enumerate(results) if r[0] == 0)
    loser_err = flat(results[1 - winner][2])
    # Nearly always the lock; a loser delayed past the whole run instead finds a finished folder.
    assert "another ctxext command is writing there" in loser_err or "already exists" in loser_err, loser_err
    assert "Traceback" not in loser_err and "run complete" not in results[1 - winner][1]
    # The folder holds one run: the winner's recipe, its steps once.
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "complete" and info["steps"] == 3
    assert f"seed: {winner + 1}" in (out / "recipe.yaml").read_text()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_a_two_process_job_is_refused_on_every_process(tmp_path, holder, cache_root):
    """Under `accelerate launch` the main process takes the lock; the other must stop too, not wait forever."""
    from tests.helpers.train import accelerate_cmd, run

    out = tmp_path / "run"
    h = holder(out)
    done = run(
        accelerate_cmd(2, "train", "recipes/tiny-cpu.yaml", f"output.dir={out}", "train.max_steps=1"),
        timeout=300,
        ACCELERATE_USE_CPU="true",
        CTXEXT_CACHE=str(cache_root),
    )
    assert done.returncode != 0
    err = flat(done.stderr)
    assert err.count(f"output.dir {out}: another ctxext command is writing there (pid {h.proc.pid}") == 2, err
    assert not out.exists() and json.loads(lock_path(out).read_text())["pid"] == h.proc.pid
