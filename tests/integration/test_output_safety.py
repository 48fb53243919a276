"""Nothing lost: every command that writes refuses an existing output, and --overwrite never deletes what
ctxext did not write (a run, a model, a user's files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.atomic import OUTPUT_MARKER, atomic_folder, check_output
from ctxext.cli.commands import app
from ctxext.errors import InputError
from tests.helpers import ROOT
from tests.helpers.train import write_fake_run

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def flat(result) -> str:
    return " ".join(result.output.split())


def hashes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def user_folder(tmp_path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my own notes")
    return folder


@pytest.fixture()
def fake_run(tmp_path, tiny_model_dir) -> Path:
    """A complete-looking run folder (run.json + adapter config); nothing here trains."""
    run_dir = write_fake_run(tmp_path / "runs" / "r", tiny_model_dir)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    return run_dir


@pytest.fixture()
def text_file(tmp_path) -> Path:
    import inspect as pyinspect

    path = tmp_path / "doc.txt"
    path.write_text(pyinspect.getsource(json) * 2)
    return path


# --- the rule itself --------------------------------------------------------------------------


def test_atomic_folder_rules(tmp_path, user_folder, monkeypatch):
    out = tmp_path / "out"
    with atomic_folder(out, kind="report") as tmp:
        (tmp / "a.txt").write_text("1")
    assert json.loads((out / OUTPUT_MARKER).read_text()) == {"kind": "report", "files": ["a.txt"]}
    with pytest.raises(InputError, match="pass --overwrite"):
        check_output(out, "report")
    with pytest.raises(InputError, match="not a model folder"):
        check_output(out, "model", overwrite=True)
    with atomic_folder(out, kind="report", overwrite=True) as tmp:
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "b.txt"]
    # A file added by the user makes the folder no longer ctxext's alone.
    (out / "mine.txt").write_text("keep")
    with pytest.raises(InputError, match=r"holds files ctxext did not write there \(mine.txt\)"):
        with atomic_folder(out, kind="report", overwrite=True) as tmp:
            (tmp / "c.txt").write_text("3")
    assert (out / "mine.txt").read_text() == "keep" and (out / "b.txt").is_file()
    with pytest.raises(InputError, match="a folder ctxext did not write"):
        check_output(user_folder, "report", overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        check_output(tmp_path / "file", "report")
    with pytest.raises(InputError, match="is a file"):
        check_output(tmp_path / "file" / "sub", "report")
    monkeypatch.chdir(user_folder)
    for cwd_like in (".", str(user_folder), str(tmp_path)):
        with pytest.raises(InputError, match="current folder"):
            check_output(cwd_like, "report", overwrite=True)
    assert (user_folder / "notes.txt").read_text() == "my own notes"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


# --- eval -------------------------------------------------------------------------------------


EVAL_ARGS = {
    "ppl": ["eval", "ppl", "--lengths", "32", "--data", "{data}"],
    "passkey": ["eval", "passkey", "--lengths", "64"],
    "needle": ["eval", "needle", "--lengths", "64"],
    "qa": ["eval", "qa", "--data", "{data}"],
    "run": ["eval", "run", str(ROOT / "eval" / "tiny-cpu.yaml")],
}


@pytest.mark.parametrize("command", list(EVAL_ARGS))
def test_eval_refuses_existing_output_and_never_replaces_a_run(
    command, tiny_model_dir, user_folder, fake_run, text_file
):
    args = [a.replace("{data}", str(text_file)) for a in EVAL_ARGS[command]]
    before = hashes(user_folder)
    result = run(*args, "--model", tiny_model_dir, "--out", user_folder)
    assert result.exit_code == 2 and "already exists and is not empty" in flat(result), result.output
    result = run(*args, "--model", tiny_model_dir, "--out", user_folder, "--overwrite")
    assert result.exit_code == 2 and "a folder ctxext did not write" in flat(result), result.output
    assert hashes(user_folder) == before
    # `eval --model runs/r --out runs/r` wiped a training run once: refused outright, --overwrite or not.
    run_before = hashes(fake_run)
    for extra in ([], ["--overwrite"]):
        result = run(*args, "--model", fake_run, "--out", fake_run, *extra)
        assert result.exit_code == 2 and "is (or contains) the input" in flat(result), result.output
        result = run(*args, "--model", fake_run, "--out", fake_run.parent, *extra)
        assert result.exit_code == 2 and "is (or contains) the input" in flat(result), result.output
    assert hashes(fake_run) == run_before
    assert "Traceback" not in result.output


def test_eval_overwrite_replaces_only_its_own_report(tiny_model_dir, tmp_path, text_file):
    out = tmp_path / "rep"
    args = ["eval", "ppl", "--model", tiny_model_dir, "--data", text_file, "--lengths", "32", "--out", out, "-q"]
    args += ["--resamples", "10", "--no-short-context", "--min-docs", "1"]  # the fixture is one document
    first = run(*args)
    assert first.exit_code == 0, first.output
    assert (out / "report.json").is_file() and (out / OUTPUT_MARKER).is_file()
    assert run(*args).exit_code == 2
    again = run(*args, "--overwrite")
    assert again.exit_code == 0, again.output
    (out / "extra.txt").write_text("mine")
    refused = run(*args, "--overwrite")
    assert refused.exit_code == 2 and "extra.txt" in flat(refused)
    assert (out / "extra.txt").read_text() == "mine" and (out / "report.json").is_file()


# --- extend -----------------------------------------------------------------------------------


def test_extend_overwrite_is_safe(tiny_model_dir, tmp_path, user_folder):
    out = tmp_path / "ext"
    args = ["extend", tiny_model_dir, "-m", "linear", "-t", "1024", "-o", out]
    assert run(*args).exit_code == 0
    assert run(*args).exit_code == 2
    assert run(*args, "--overwrite").exit_code == 0
    # Never the source model, never a folder with the user's files, never the current folder.
    source_before = hashes(tiny_model_dir)
    result = run("extend", tiny_model_dir, "-m", "linear", "-t", "1024", "-o", tiny_model_dir, "--overwrite")
    assert result.exit_code == 2 and "a model folder" in flat(result)
    assert hashes(tiny_model_dir) == source_before
    result = run("extend", tiny_model_dir, "-m", "linear", "-t", "1024", "-o", user_folder, "--overwrite")
    assert result.exit_code == 2 and (user_folder / "notes.txt").is_file()
    # Small files are copies: editing the extended folder's tokenizer leaves the source's alone.
    for name in ("tokenizer.json", "generation_config.json", "tokenizer_config.json"):
        if (out / name).is_file():
            assert (out / name).stat().st_ino != (tiny_model_dir / name).stat().st_ino, name
    assert (out / "model.safetensors").stat().st_ino == (tiny_model_dir / "model.safetensors").stat().st_ino


# --- merge ------------------------------------------------------------------------------------


def test_merge_refuses_existing_and_inputs(fake_run, tmp_path, user_folder, tiny_model_dir):
    result = run("merge", fake_run, "--out", user_folder)
    assert result.exit_code == 2 and "already exists" in flat(result)
    result = run("merge", fake_run, "--out", user_folder, "--overwrite")
    assert result.exit_code == 2 and (user_folder / "notes.txt").is_file()
    for target in (fake_run, fake_run.parent, tiny_model_dir):
        result = run("merge", fake_run, "--out", target, "--overwrite")
        assert result.exit_code == 2, result.output
        assert "is (or contains) the input" in flat(result) or "a model folder" in flat(result), result.output
    assert (fake_run / "run.json").is_file() and (tiny_model_dir / "model.safetensors").is_file()


# --- train ------------------------------------------------------------------------------------


def test_train_refuses_a_non_empty_or_file_output(tmp_path, user_folder, tiny_model_dir):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  path: {tiny_model_dir}\nrope:\n  method: yarn\n  target_length: 512\n"
        "data:\n  path: builtin:stdlib\ntrain:\n  max_steps: 1\n  seq_len: 512\n"
    )
    result = run("train", recipe, f"output.dir={user_folder}")
    assert result.exit_code == 2 and "not empty" in flat(result)
    (tmp_path / "afile").write_text("x")
    result = run("train", recipe, f"output.dir={tmp_path / 'afile'}")
    assert result.exit_code == 2 and "is a file" in flat(result), result.output
    assert (user_folder / "notes.txt").read_text() == "my own notes"


# --- push staging and demo --------------------------------------------------------------------


def test_push_never_replaces_a_users_hub_folder(tmp_path_factory, tiny_model_dir, tmp_path):
    from tests.helpers.hub import copy_run, shared_run

    run_dir = copy_run(shared_run(tmp_path_factory, tiny_model_dir), tmp_path / "run")
    (run_dir / "hub").mkdir()
    (run_dir / "hub" / "draft.md").write_text("my card draft")
    result = run("push", run_dir, "--repo-id", "me/x", "--dry-run")
    assert result.exit_code == 2 and "a folder ctxext did not write" in flat(result), result.output
    assert (run_dir / "hub" / "draft.md").read_text() == "my card draft"
    (run_dir / "hub" / "draft.md").unlink()
    (run_dir / "hub").rmdir()
    assert run("push", run_dir, "--repo-id", "me/x", "--dry-run").exit_code == 0
    # Its own staging folder is rebuilt on every push.
    assert run("push", run_dir, "--repo-id", "me/x", "--dry-run").exit_code == 0


def test_demo_refuses_a_foreign_folder_and_fresh_deletes_only_its_own(tmp_path, user_folder):
    from ctxext.cli.demo import prepare_demo_folder

    result = run("demo", "--out", user_folder, "--quick")
    assert result.exit_code == 2 and "not empty" in flat(result)
    result = run("demo", "--out", user_folder, "--quick", "--fresh")
    assert result.exit_code == 2 and (user_folder / "notes.txt").is_file()
    demo = prepare_demo_folder(tmp_path / "demo", fresh=False)
    (demo / "report").mkdir()
    (demo / "report" / "report.json").write_text("{}")
    (demo / "my-notes.txt").write_text("keep")
    prepare_demo_folder(demo, fresh=True)
    assert not (demo / "report").exists() and (demo / "my-notes.txt").read_text() == "keep"


# --- base weights fingerprint -----------------------------------------------------------------


def test_changed_base_weights_are_refused_by_merge_eval_and_push(tmp_path_factory, tiny_model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from ctxext.models.weights import fingerprint
    from tests.helpers.hub import copy_run, shared_run

    shared = shared_run(tmp_path_factory, tiny_model_dir)
    recorded = json.loads((shared / "run.json").read_text())["base_fingerprint"]  # written by `ctxext train`
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    assert fingerprint(base) == recorded  # the same weights: the run's own fingerprint matches them
    # The run's base moved to a folder of the user's (its recorded fingerprint is kept as train wrote it).
    run_dir = copy_run(shared, tmp_path / "run", base_model=str(base), base_model_resolved=str(base))
    # Same path, same architecture and size, other weights (one tensor changed).
    tensors = load_file(base / "model.safetensors")
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] * 1.5
    (base / "model.safetensors").unlink()  # a new file, not an edit of the hard-linked one
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(base) != recorded
    for args in (
        ["merge", run_dir, "--out", tmp_path / "merged"],
        ["eval", "passkey", "--model", run_dir, "--lengths", "64", "--out", tmp_path / "rep"],
        # The base named explicitly beside the run's adapter: checked the same way.
        ["eval", "passkey", "--model", base, "--adapter", run_dir, "--lengths", "64", "--out", tmp_path / "rep"],
        ["push", run_dir, "--repo-id", "me/x", "--dry-run"],
    ):
        result = run(*args)
        assert result.exit_code == 2, (args[0], result.output)
        assert "not the ones this run was trained on" in flat(result), result.output
    assert not (tmp_path / "merged").exists() and not (tmp_path / "rep").exists()


def test_search_overwrite_never_deletes_a_foreign_folder(tiny_model_dir, user_folder):
    before = hashes(user_folder)
    for extra in ([], ["--overwrite"]):
        result = run("search", tiny_model_dir, "-t", "1024", "--out", user_folder, "--budget", "5s", *extra)
        assert result.exit_code == 2, result.output
    assert "a folder ctxext did not write" in flat(result)
    assert hashes(user_folder) == before


# --- an output folder that is a symbolic link ---------------------------------------------------

# Each writing command family, with --overwrite where it has one: a link as the output is refused before any work.
LINKED_OUTPUT = {
    "extend": ["extend", "{model}", "-m", "linear", "-t", "512", "-o", "{link}", "--overwrite"],
    "eval ppl": ["eval", "ppl", "--model", "{model}", "--out", "{link}", "--overwrite"],
    "merge": ["merge", "{run}", "--out", "{link}", "--overwrite"],
    "export": ["export", "{run}", "--for", "vllm", "--out", "{link}", "--overwrite"],
    "search": ["search", "{model}", "-t", "1024", "--out", "{link}", "--overwrite", "--budget", "5s"],
    "tasks export": ["tasks", "export", "{link}", "--model", "{model}", "--tasks", "passkey", "--lengths", "128"],
    "train": ["train", "{recipe}", "output.dir={link}"],
}


@pytest.mark.parametrize("command", list(LINKED_OUTPUT))
def test_an_output_that_is_a_symlink_is_refused_with_the_real_path(command, tmp_path, fake_run, tiny_model_dir):
    real = tmp_path / "elsewhere" / "target"
    real.mkdir(parents=True)
    link = tmp_path / "out-link"
    link.symlink_to(real, target_is_directory=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  path: {tiny_model_dir}\nrope:\n  method: yarn\n  target_length: 512\n"
        "data:\n  path: builtin:stdlib\ntrain:\n  max_steps: 1\n  seq_len: 512\n"
    )
    values = {"model": tiny_model_dir, "run": fake_run, "link": link, "recipe": recipe}
    result = run(*[a.format(**values) for a in LINKED_OUTPUT[command]])
    assert result.exit_code == 2, result.output
    text = flat(result)
    assert f"{link}: is a symbolic link to {real}" in text and "Give the real path (" in text, text
    assert "Traceback" not in result.output
    assert link.is_symlink() and list(real.iterdir()) == []  # neither the link nor its target was touched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out-link", "r.yaml", "runs"]


def test_push_refuses_a_staging_folder_that_is_a_symlink(tmp_path_factory, tiny_model_dir, tmp_path):
    from tests.helpers.hub import copy_run, shared_run

    run_dir = copy_run(shared_run(tmp_path_factory, tiny_model_dir), tmp_path / "run")
    real = tmp_path / "cards"
    real.mkdir()
    (run_dir / "hub").symlink_to(real, target_is_directory=True)
    result = run("push", run_dir, "--repo-id", "me/x", "--dry-run")
    assert result.exit_code == 2, result.output
    assert f"staging folder {run_dir / 'hub'}: is a symbolic link to {real}" in flat(result), result.output
    assert "Remove the link" in flat(result) and (run_dir / "hub").is_symlink() and list(real.iterdir()) == []


def test_a_link_to_a_folder_ctxext_wrote_is_refused_too(tmp_path):
    real = tmp_path / "report"
    with atomic_folder(real, kind="report") as tmp:
        (tmp / "report.json").write_text("{}")
    link = tmp_path / "latest"
    link.symlink_to(real)
    with pytest.raises(InputError, match=r"is a symbolic link to .*Give the real path \(--out .*report\)"):
        check_output(link, "report", overwrite=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "scratch").symlink_to(tmp_path / "runs")
    assert check_output(tmp_path / "scratch" / "r1", "report") == tmp_path / "scratch" / "r1"  # a link above is fine
