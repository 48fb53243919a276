"""A real tiny training run folder and a real evaluation report, for the merge / card / push tests.

The run is made the way ``ctxext train`` makes one (the run-folder contract in ctxext/artifacts/run.py):
the base is loaded in 4-bit nf4 with bitsandbytes and the run's patched YaRN config, prepared for
k-bit training, wrapped with LoRA + fully trained embeddings and norms (peft ``modules_to_save``),
trained for a few real optimizer steps on real text, and saved with ``save_pretrained``. The report
holds numbers measured on that run (perplexity by length and position, passkey trials) and a PNG.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

TARGET = 1024
ORIGINAL = 256
LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "extra_trainable": ["embed_tokens", "norm"],
}


def _recipe_yaml(base_dir: Path, steps: int) -> str:
    from ctxext.recipe.schema import dump_recipe, parse_recipe

    recipe = parse_recipe(
        {
            "model": {"path": str(base_dir)},
            "rope": {"method": "yarn", "target_length": TARGET},
            "lora": LORA,
            "data": {"path": "builtin:stdlib"},
            "train": {"seq_len": ORIGINAL, "max_steps": steps, "learning_rate": 1e-2},
            "hub": {"repo_id": "me/tiny-llama-yarn-1k", "push": False},
            "output": {"dir": "runs/tiny"},
        }
    )
    return dump_recipe(recipe)


def build_tiny_run(base_dir: Path, run_dir: Path, steps: int = 3, status: str = "complete") -> Path:
    """Train a tiny QLoRA run for a few steps and write a complete run folder.

    Args:
        base_dir: a saved tiny Llama with tokenizer (conftest's ``tiny_model_dir``).
        run_dir: the run folder to write.
        steps: optimizer steps.
        status: ``run.json`` status (``complete``, ``running``, ``failed``).

    Returns:
        ``run_dir``.
    """
    import transformers
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from ctxext.publish.merge import text_tokens
    from ctxext.rope.core import apply_plan, plan_extension, verify_model_rope

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(base_dir)
    plan = plan_extension(config, "yarn", TARGET)
    apply_plan(config, plan)
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )
    model = AutoModelForCausalLM.from_pretrained(
        base_dir, config=config, quantization_config=quant, dtype=torch.float32, attn_implementation="sdpa"
    )
    verify_model_rope(model)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    lora = LoraConfig(
        r=LORA["r"],
        lora_alpha=LORA["alpha"],
        lora_dropout=LORA["dropout"],
        target_modules=LORA["target_modules"],
        modules_to_save=LORA["extra_trainable"],
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    data = text_tokens(tokenizer, ORIGINAL * steps)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    model.train()
    for step in range(steps):
        ids = data[:, step * ORIGINAL : (step + 1) * ORIGINAL]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    run_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(run_dir)
    config.save_pretrained(run_dir)
    tokenizer.save_pretrained(run_dir)
    (run_dir / "recipe.yaml").write_text(_recipe_yaml(base_dir, steps))
    (run_dir / "versions.json").write_text(
        json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}, indent=2)
    )
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "loss": v}) + "\n" for i, v in enumerate(losses))
    )
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    run = {
        "status": status,
        "base_model": "me/tiny-llama",  # what the user named; resolved below to the local folder
        "base_model_resolved": str(base_dir),
        "method": "yarn",
        "rope_parameters": plan.rope_parameters,
        "original_length": ORIGINAL,
        "target_length": TARGET,
        "seq_len": ORIGINAL,
        "steps": steps,
        "tokens_seen": steps * ORIGINAL,
        "quantization": "nf4",
        "lora": {k: v for k, v in LORA.items() if k != "extra_trainable"},
        "extra_trainable": LORA["extra_trainable"],
        "final_train_loss": losses[-1],
        "final_val_loss": losses[-1] + 0.01,
    }
    (run_dir / "run.json").write_text(json.dumps(run, indent=2))
    return run_dir


def _load(base_dir: Path, run_dir: Path | None) -> Any:
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    if run_dir is None:
        return AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="sdpa").eval()
    config = AutoConfig.from_pretrained(run_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, config=config, attn_implementation="sdpa")
    return PeftModel.from_pretrained(base, run_dir).eval()


@torch.no_grad()
def measure_report(base_dir: Path, run_dir: Path, lengths: tuple[int, ...] = (256, 512, 1024)) -> Any:
    """Measure a side-by-side report (base vs base + adapter) and write ``<run>/eval/report.json`` + a PNG.

    Truncated-document perplexity on standard-library text, per length and per 256-token position
    bucket, and passkey trials on a lengths × depths grid.

    Args:
        base_dir: the base model folder.
        run_dir: the run folder.
        lengths: evaluation lengths.

    Returns:
        The :class:`~ctxext.artifacts.report.EvalReport` written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from transformers import AutoTokenizer

    from ctxext.artifacts.report import (
        Accuracy,
        EvalReport,
        Grid,
        GridCell,
        ModelEntry,
        ModelInfo,
        Perplexity,
        RopeInfo,
    )
    from ctxext.evaluation.stats import wilson_interval
    from ctxext.publish.merge import passkey_trial, text_tokens

    tokenizer = AutoTokenizer.from_pretrained(run_dir)
    docs = text_tokens(tokenizer, max(lengths) * 2).view(2, max(lengths))
    models = []
    for name, adapter in (("base", None), ("fine-tuned", run_dir)):
        model = _load(base_dir, adapter)
        logits = model(input_ids=docs).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), docs[:, 1:].reshape(-1), reduction="none"
        ).view(docs.shape[0], -1)
        by_length = {}
        for length in lengths:
            part = nll[:, : length - 1]
            per_doc = part.mean(dim=1)  # the interval here: the range over the (two) documents
            by_length[str(length)] = {
                "ppl": math.exp(float(part.mean())),
                "nll": float(part.mean()),
                "tokens": part.numel(),
                "documents": docs.shape[0],
                "ci_low": math.exp(float(per_doc.min())),
                "ci_high": math.exp(float(per_doc.max())),
                "beyond_context": adapter is None and length > ORIGINAL,
            }
        buckets = []
        for start in range(0, max(lengths), 256):
            # Bucket = position of the predicted token; position p is predicted by nll[:, p - 1].
            part = nll[:, max(start - 1, 0) : start + 255]
            buckets.append(
                {
                    "start": start,
                    "end": start + 256,
                    "tokens": part.numel(),
                    "nll": float(part.mean()),
                    "ppl": math.exp(float(part.mean())),
                }
            )
        cells = []
        # Passkey: a small grid for the extended model only (the base cannot address the longer lengths).
        for length in lengths[-2:] if adapter is not None else ():
            for depth in (0, 100):
                _, _, correct = passkey_trial(model, tokenizer, length, seed=length + depth, depth=depth / 100)
                hit = int(correct)
                cells.append(GridCell(length=length, depth=depth, trials=1, correct=hit, accuracy=float(hit)))
        short = by_length[str(ORIGINAL)]
        config = json.loads(((adapter or base_dir) / "config.json").read_text())
        entry = ModelEntry(
            name=name,
            # How ctxext eval records the two models: the base as is, the run as base + adapter + patched config.
            model=ModelInfo(ref=str(base_dir), adapter=str(adapter) if adapter else None, config_from=None),
            rope=RopeInfo(
                rope_type=(config.get("rope_parameters") or {}).get("rope_type", "default"),
                rope_theta=(config.get("rope_parameters") or {}).get("rope_theta", 10000.0),
                original_length=ORIGINAL,
                current_length=TARGET if adapter else ORIGINAL,
            ),
            perplexity=Perplexity(
                protocol="truncated-document perplexity",
                by_length=by_length,
                by_bucket=buckets,
                short_context={"length": ORIGINAL, **{k: v for k, v in short.items() if k != "beyond_context"}},
            ),
        )
        if cells:
            by_len = {}
            for length in sorted({c.length for c in cells}):
                mine = [c for c in cells if c.length == length]
                correct = sum(c.correct for c in mine)
                low, high = wilson_interval(correct, len(mine))
                by_len[str(length)] = Accuracy(
                    correct=correct, trials=len(mine), accuracy=correct / len(mine), ci_low=low, ci_high=high
                )
            entry.passkey = Grid(scoring="teacher-forced", cells=cells, by_length=by_len)
        models.append(entry)
    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(4, 3))
    for m in models:
        b = m.perplexity.by_bucket
        ax.plot([x.start for x in b], [x.ppl for x in b], label=m.name)
    ax.set_xlabel("position")
    ax.set_ylabel("perplexity")
    ax.legend()
    fig.savefig(out / "ppl_by_position.png", dpi=60)
    plt.close(fig)
    # Built and written through the report schema (ctxext/artifacts/report.py), as `ctxext eval` writes it.
    report = EvalReport(models=models, data={"perplexity": {"source": "builtin:stdlib"}})
    (out / "report.json").write_text(report.to_json())
    return report


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (to prove a failed push left them alone)."""
    import hashlib

    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# One run, report and merge per test session, shared by every test module that imports the fixtures
# (a fixture imported into several modules would otherwise be built once per module).
_BUILT: dict[str, Any] = {}


def shared_run(tmp_path_factory: Any, base_dir: Path) -> Path:
    """The session's tiny run folder, with its evaluation report (built on first use)."""
    if "run" not in _BUILT:
        run_dir = build_tiny_run(base_dir, tmp_path_factory.mktemp("hub") / "run")
        measure_report(base_dir, run_dir)
        _BUILT["run"] = run_dir
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
    import shutil

    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("hub", "merged"))
    run = json.loads((dest / "run.json").read_text())
    run.update(changes)
    (dest / "run.json").write_text(json.dumps(run, indent=2))
    return dest


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
