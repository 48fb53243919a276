"""The session's tiny training run and its evaluation report, made by ctxext's own workflows.

The merge / card / push tests share one run folder made the way a user makes one: a recipe (nf4, YaRN
256 → 1024, LoRA r 8 with embeddings and norms trained in full, a few steps on ``builtin:stdlib``) run by
:func:`ctxext.training.run.train`, then the recipe's eval suite (base, patched-only and fine-tuned side by
side) run by :func:`ctxext.evaluation.suite.run_suite_for_run`, as ``ctxext train`` does after training.

The base is named by its Hub id, ``me/tiny-llama``: the tiny model is placed in a temporary Hugging Face
cache in the Hub's snapshot layout, and huggingface_hub resolves the id from it offline while the run is
made, as on a user's machine that downloaded the base before. ``run.json`` then holds the Hub id, the
snapshot folder it resolved to and the fingerprint of its weights, all written by ``train``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.train import write_recipe

TARGET = 1024
ORIGINAL = 256
HUB_ID = "me/tiny-llama"
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "extra_trainable": ["embed_tokens", "norm"],
}
# What the card and the merge read, kept small: perplexity at 256 / 512 / 1024 on two documents (buckets of
# 256 tokens), passkey at 512 / 1024 at two depths, one trial each.
SUITE = """\
name: hub-tests
perplexity: {data: "builtin:stdlib", lengths: ["1x", "2x", "target"], bucket_size: 256, max_docs: 2, min_docs: 2,
  resamples: 100}
passkey: {lengths: ["2x", "target"], depths: [0, 100], trials: 1, max_new_tokens: 8}
"""


def place_in_hub_cache(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """Lay a model folder out in a Hugging Face cache as a download of ``repo_id`` would leave it.

    ``models--ORG--NAME/blobs/<sha256>`` holds each file, ``snapshots/<commit>/<file>`` links to it, and
    ``refs/main`` names the commit.

    Args:
        cache: the cache root (what ``HF_HUB_CACHE`` points at).
        repo_id: the Hub id.
        model_dir: a saved model folder with its tokenizer.

    Returns:
        The snapshot folder.
    """
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    commit = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in files:
        blob = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, repo / "blobs" / blob)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", blob))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@contextmanager
def hub_cache(cache: Path) -> Iterator[None]:
    """Point huggingface_hub at ``cache`` (``snapshot_download`` reads ``constants.HF_HUB_CACHE`` per call)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_CACHE
    constants.HF_HUB_CACHE = str(cache)
    try:
        yield
    finally:
        constants.HF_HUB_CACHE = before


def build_tiny_run(base: str | Path, run_dir: Path, steps: int = 3, suite: Path | None = None) -> Path:
    """Train a tiny QLoRA run with ``ctxext.training.run.train``; with a suite, evaluate it as ``ctxext train`` does.

    Args:
        base: the base model: a folder, or a Hub id resolvable from the current Hugging Face cache.
        run_dir: the run folder to write (``output.dir``).
        steps: optimizer steps.
        suite: an eval suite YAML for the recipe's ``eval.suite`` (with ``eval.compare_base``); ``None`` to
            train only.

    Returns:
        ``run_dir``.
    """
    from ctxext.evaluation.suite import run_suite_for_run
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.run import train

    recipe_path = write_recipe(
        run_dir.with_name(run_dir.name + "-recipe.yaml"),
        run_dir,
        model={"path": str(base)},
        rope={"method": "yarn", "target_length": TARGET},
        lora=LORA,
        data={"max_documents": 10},
        train={
            "seq_len": ORIGINAL,
            "micro_batch_size": 1,
            "max_steps": steps,
            "learning_rate": 1e-2,
            "warmup_steps": 0,
            "eval_batches": 1,
        },
        eval={"suite": str(suite) if suite else None, "compare_base": suite is not None},
        hub={"repo_id": "me/tiny-llama-yarn-1k", "push": False},
    )
    recipe = load_recipe(recipe_path)
    train(recipe)
    if suite is not None:
        run_suite_for_run(run_dir, recipe, show_progress=False)
    return run_dir


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (to prove a failed push left them alone)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# One run, report and merge per test session, shared by every test module that imports the fixtures
# (a fixture imported into several modules would otherwise be built once per module).
_BUILT: dict[str, Any] = {}


def shared_run(tmp_path_factory: Any, base_dir: Path) -> Path:
    """The session's tiny run folder, trained from ``me/tiny-llama`` and evaluated (built on first use)."""
    if "run" not in _BUILT:
        tmp = tmp_path_factory.mktemp("hub")
        cache = tmp / "hf-cache"
        place_in_hub_cache(cache, HUB_ID, base_dir)
        (tmp / "suite.yaml").write_text(SUITE)
        with hub_cache(cache):
            _BUILT["run"] = build_tiny_run(HUB_ID, tmp / "run", suite=tmp / "suite.yaml")
    return _BUILT["run"]


def shared_merge(tmp_path_factory: Any, base_dir: Path) -> tuple[Path, Any]:
    """The session's merged model folder and its smoke-test result (built on first use)."""
    if "merged" not in _BUILT:
        from ctxext.publish.merge import merge_run

        run_dir = shared_run(tmp_path_factory, base_dir)
        out = tmp_path_factory.mktemp("merged") / "model"
        _BUILT["merged"] = (out, merge_run(run_dir, out, log=lambda line: None))
    return _BUILT["merged"]


def copy_run(run_dir: Path, dest: Path, **changes: Any) -> Path:
    """A copy of a run folder with ``run.json`` fields changed (e.g. ``status="running"``)."""
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("hub", "merged"))
    run = json.loads((dest / "run.json").read_text())
    run.update(changes)
    (dest / "run.json").write_text(json.dumps(run, indent=2))
    return dest


def write_calibration(run_dir: Path, t: float, adapter: str | None = None) -> Path:
    """A ``calibration.json`` as ``ctxext calibrate`` writes one choosing ``t`` (1.0 and ``t`` measured, ``t``
    admissible and better), for the run's adapter (or the digest ``adapter``); returns the run folder."""
    from ctxext.models.temperature import CALIBRATION_FILE, adapter_digest

    rows = [{"attention_temperature": 1.0, "admissible": True, "better": False}]
    if t != 1.0:
        rows.append({"attention_temperature": t, "admissible": True, "better": True})
    record = {"attention_temperature": t, "adapter": adapter or adapter_digest(run_dir), "candidates": rows}
    (run_dir / CALIBRATION_FILE).write_text(json.dumps(record))
    return run_dir


class LocalHub:
    """A minimal local stand-in for the Hub's HTTP API (the real Hub is unreachable from tests).

    It answers the calls huggingface_hub's ``create_repo``, ``create_branch`` and ``upload_folder``
    make (repo creation, branch, README metadata validation, pre-upload, commit), telling the client
    to send every file inline, and records each request so a test can check what a push really sent.

    Args:
        refuse_metadata: answer the metadata validation with a 400 error, as the Hub does for a bad card.
    """

    def __init__(self, refuse_metadata: bool = False):
        self.requests: list[tuple[str, str, bytes]] = []
        self.refuse_metadata = refuse_metadata

    def __enter__(self) -> LocalHub:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding") == "chunked":
                    data = b""
                    while (size := int(self.rfile.readline().strip(), 16)) > 0:
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return data
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _send(self, code: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self._body()
                hub.requests.append(("POST", self.path, body))
                if self.path == "/api/repos/create":
                    name = json.loads(body)
                    return self._send(200, {"url": f"{hub.endpoint}/{name['organization']}/{name['name']}"})
                if self.path == "/api/validate-yaml":
                    if hub.refuse_metadata:
                        return self._send(400, {"errors": [{"message": '"model-index" is invalid'}]})
                    return self._send(200, {"errors": [], "warnings": []})
                if "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                    return self._send(200, {"files": modes})
                if "/branch/" in self.path:
                    return self._send(200, {})
                if "/commit/" in self.path:
                    repo = self.path.split("/api/models/")[1].split("/commit/")[0]
                    return self._send(
                        200, {"commitUrl": f"{hub.endpoint}/{repo}/commit/{'0' * 40}", "commitOid": "0" * 40}
                    )
                return self._send(404, {"error": "not found"})

            def do_GET(self) -> None:  # noqa: N802
                hub.requests.append(("GET", self.path, b""))
                self._send(404, {"error": "not found"})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def commits(self) -> list[dict[str, Any]]:
        """Every commit received: ``{"path": url path, "summary": ..., "files": {path in repo: bytes}}``."""
        import base64

        out = []
        for method, path, body in self.requests:
            if method != "POST" or "/commit/" not in path:
                continue
            commit: dict[str, Any] = {"path": path, "files": {}}
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "header":
                    commit["summary"] = item["value"]["summary"]
                elif item["key"] == "file":
                    commit["files"][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            out.append(commit)
        return out
