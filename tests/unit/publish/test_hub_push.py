"""``ctxext push``: dry run, and every way a push can be refused, without sending anything anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.artifacts.report import EvalReport
from ctxext.cli.commands import app
from ctxext.publish.hub import HubError, push, push_run
from ctxext.recipe.sections import HubSection
from tests.helpers.hub import LocalHub, copy_run, file_hashes, shared_run

runner = CliRunner()
PUBLISHED = {
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "config.json",
    "eval/report.json",
    "eval/report.md",
    "plots/passkey_heatmap.png",
    "plots/ppl_by_length.png",
    "plots/ppl_by_position.png",
    "recipe.yaml",
    "tokenizer.json",
    "tokenizer_config.json",
    "versions.json",
}


def flat(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def own_files(folder: Path) -> dict[str, str]:
    """Hashes of the run's own files (the staged hub/ folder is push's output, rebuilt each time)."""
    return {k: v for k, v in file_hashes(folder).items() if not k.startswith("hub/")}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


@pytest.fixture()
def run_copy(tiny_run, tmp_path) -> Path:
    return copy_run(tiny_run, tmp_path / "run")


@pytest.fixture()
def online(monkeypatch, tmp_path):
    """huggingface_hub as on a machine with network access, but with no stored token."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    return constants


def test_dry_run_lists_exactly_the_staged_files_and_sends_nothing(run_copy):
    before = own_files(run_copy)
    result = runner.invoke(app, ["push", str(run_copy), "--repo-id", "me/tiny-yarn", "--dry-run"])
    assert result.exit_code == 0, result.output
    staging = run_copy / "hub"
    # The staging folder also holds ctxext's record of what it wrote there (never uploaded).
    staged = {
        p.relative_to(staging).as_posix(): p.stat().st_size
        for p in staging.rglob("*")
        if p.is_file() and p.name != ".ctxext-output.json"
    }
    assert set(staged) == PUBLISHED
    out = flat(result)
    assert "target: https://huggingface.co/me/tiny-yarn (private, default branch), LoRA adapter" in out
    for name in staged:
        assert name in out
    assert "nothing was sent" in out
    assert "checkpoints" not in out and "metrics.jsonl" not in out and "run.json" not in out
    # The published adapter names the base by its Hub id, not the local folder training used.
    assert json.loads((staging / "adapter_config.json").read_text())["base_model_name_or_path"] == "me/tiny-llama"
    assert (staging / "README.md").read_text().startswith("---\nbase_model: me/tiny-llama\n")
    assert own_files(run_copy) == before


def test_a_run_from_a_local_base_is_staged_with_a_note_and_no_hub_base(tiny_run, tmp_path):
    """A user who trained from a local folder: no base_model metadata, the folder named, a note before pushing."""
    local = json.loads((tiny_run / "run.json").read_text())["base_model_resolved"]
    run = copy_run(tiny_run, tmp_path / "run", base_model=local)
    lines: list[str] = []
    push(run, "me/tiny-yarn", dry_run=True, log=lines.append)
    assert any("is not a Hub id" in line and local in line for line in lines), lines
    card = (run / "hub" / "README.md").read_text()
    assert "base_model:" not in card.split("---")[1]  # the front matter names no Hub base
    assert f"`{local}` is not a Hub id" in card and f'AutoModelForCausalLM.from_pretrained("{local}"' in card
    # The adapter keeps the base folder peft recorded at training time (nothing to rename it to).
    staged = json.loads((run / "hub" / "adapter_config.json").read_text())
    assert staged["base_model_name_or_path"] == local


def test_dry_run_with_extra_report_and_public_branch(run_copy, tmp_path):
    from ctxext.evaluation.report import write_report

    extra = tmp_path / "long-eval"
    entry = {"ppl": 9.5, "nll": 2.25, "tokens": 9, "documents": 1}
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "original_length": 256, "current_length": 2048}
    model = {"name": "x", "model": {"adapter": "run"}, "rope": rope, "perplexity": {"by_length": {"2048": entry}}}
    write_report(EvalReport.model_validate({"models": [model]}), extra)  # as `ctxext eval` writes it: card parts
    result = push(
        run_copy, "me/tiny-yarn", private=False, revision="v1", dry_run=True, report=[extra], log=lambda s: None
    )
    names = {name for name, _ in result.plan.files}
    assert "eval/long-eval/report.json" in names
    assert "public, branch v1" in result.plan.describe()
    assert "Perplexity @ 2048 tokens" in (run_copy / "hub" / "README.md").read_text()


def test_missing_report_file_is_a_clear_error(run_copy, tmp_path):
    result = runner.invoke(
        app, ["push", str(run_copy), "--repo-id", "me/x", "--dry-run", "--report", str(tmp_path / "nope.json")]
    )
    assert result.exit_code == 2 and "does not exist" in flat(result)


def test_report_of_an_unknown_layout_is_a_clear_error(run_copy, tmp_path):
    # A layout ctxext never wrote (no "schema"): refused by name, exit code 2, nothing staged.
    (tmp_path / "report.json").write_text(json.dumps({"model": "x", "perplexity": {"by_length": {}}}))
    result = runner.invoke(
        app, ["push", str(run_copy), "--repo-id", "me/x", "--dry-run", "--report", str(tmp_path / "report.json")]
    )
    assert result.exit_code == 2 and "is not a ctxext evaluation report" in flat(result)
    assert "Traceback" not in result.output and not (run_copy / "hub").exists()


def test_bad_repo_id_is_refused(run_copy):
    result = runner.invoke(app, ["push", str(run_copy), "--repo-id", "not a repo", "--dry-run"])
    assert result.exit_code == 2 and "USER/NAME" in flat(result)
    assert not (run_copy / "hub").exists()


def test_incomplete_run_is_refused_unless_forced(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run", status="running")
    result = runner.invoke(app, ["push", str(run), "--repo-id", "me/x", "--dry-run"])
    assert result.exit_code == 2
    assert "not complete" in flat(result) and "--force" in flat(result)
    assert not (run / "hub").exists()
    forced = runner.invoke(app, ["push", str(run), "--repo-id", "me/x", "--dry-run", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "unfinished training run" in (run / "hub" / "README.md").read_text()


def test_no_token_says_how_to_log_in(run_copy, online):
    before = own_files(run_copy)
    with pytest.raises(HubError) as info:
        push(run_copy, "me/tiny-yarn", log=lambda s: None)
    message = str(info.value)
    assert "hf auth login" in message and "HF_TOKEN" in message and "Nothing was uploaded" in message
    assert own_files(run_copy) == before


def test_offline_mode_is_named(run_copy):
    # Tests run with HF_HUB_OFFLINE=1 (conftest), as a user with offline mode set would.
    result = runner.invoke(app, ["push", str(run_copy), "--repo-id", "me/tiny-yarn"])
    assert result.exit_code == 1 and "HF_HUB_OFFLINE=1" in flat(result)
    assert "Traceback" not in result.output


class _Refuse(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = json.dumps({"error": "You don't have the rights to create a model under the namespace 'me'"}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


def test_hub_refusing_is_a_clear_error_and_keeps_files(run_copy, online, monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(online, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    before = own_files(run_copy)
    try:
        with pytest.raises(HubError) as info:
            push(run_copy, "me/tiny-yarn", log=lambda s: None)
    finally:
        server.shutdown()
    message = str(info.value)
    assert endpoint in message and "403" in message and "write access" in message
    assert own_files(run_copy) == before


def test_unreachable_endpoint_fails_cleanly_from_the_command_line(run_copy):
    """A real process with the user's environment: HF_ENDPOINT pointing at a closed port."""
    before = own_files(run_copy)
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_not_real"}
    proc = subprocess.run(
        [sys.executable, "-m", "ctxext", "push", str(run_copy), "--repo-id", "me/tiny-yarn"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 1, proc.stderr
    assert "http://127.0.0.1:9 is unreachable" in err and "local files are unchanged" in err
    assert "Traceback" not in proc.stderr
    assert own_files(run_copy) == before


def test_push_run_follows_the_recipe_hub_section(run_copy):
    assert push_run(run_copy, HubSection(repo_id="me/x", push=False)) is None
    with pytest.raises(HubError, match="HF_HUB_OFFLINE"):
        push_run(run_copy, HubSection(repo_id="me/x", push=True), log=lambda s: None)
    assert (run_copy / "hub" / "README.md").is_file()


def test_merged_model_is_published_with_its_weights_and_a_transformers_card(run_copy, tmp_path_factory, tiny_model_dir):
    import shutil

    from tests.helpers.hub import shared_merge

    merged, _ = shared_merge(tmp_path_factory, tiny_model_dir)
    shutil.copytree(merged, run_copy / "merged")  # as `ctxext push RUN --merged` leaves it
    result = push(run_copy, "me/tiny-yarn", merged=True, dry_run=True, log=lambda s: None)
    names = {name for name, _ in result.plan.files}
    assert result.plan.source == run_copy / "merged" and result.plan.merged
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "eval/report.json"} <= names
    assert not any(name.startswith("adapter_") for name in names) and "ctxext_merge.json" not in names
    card = (run_copy / "merged" / "hub" / "README.md").read_text()
    assert "library_name: transformers" in card and "## Merge check" in card


def test_push_sends_the_staged_folder_as_one_commit(run_copy, online, monkeypatch):
    with LocalHub() as hub:
        monkeypatch.setattr(online, "ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_local_test")
        result = push(run_copy, "me/tiny-yarn", revision="v1", log=lambda s: None)
    assert result.commit_url == f"{hub.endpoint}/me/tiny-yarn/commit/{'0' * 40}"
    create = next(json.loads(body) for method, path, body in hub.requests if path == "/api/repos/create")
    assert create == {"name": "tiny-yarn", "organization": "me", "visibility": "private", "type": "model"}
    assert any(path == "/api/models/me/tiny-yarn/branch/v1" for _, path, _ in hub.requests)
    (commit,) = hub.commits()
    assert commit["path"] == "/api/models/me/tiny-yarn/commit/v1"
    assert commit["summary"] == "ctxext: yarn 256→1024 adapter"
    staging = run_copy / "hub"
    assert set(commit["files"]) == PUBLISHED
    for name, data in commit["files"].items():
        assert data == (staging / name).read_bytes(), name
    assert commit["files"]["adapter_model.safetensors"] == (run_copy / "adapter_model.safetensors").read_bytes()


def test_card_refused_by_the_hub_is_a_clear_error(run_copy, online, monkeypatch):
    with LocalHub(refuse_metadata=True) as hub:
        monkeypatch.setattr(online, "ENDPOINT", hub.endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_local_test")
        with pytest.raises(HubError) as info:
            push(run_copy, "me/tiny-yarn", log=lambda s: None)
        assert hub.commits() == []
    message = str(info.value)
    assert hub.endpoint in message and "Invalid metadata in README.md" in message and "model-index" in message
