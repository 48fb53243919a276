"""Helpers for the training tests: small recipes, subprocess launches, adapter tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import ROOT

# Small and quick: the tiny Llama of the fixtures (context 256) at 2x its context, 10 stdlib files.
BASE_RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:tiny-llama"},
    "rope": {"method": "yarn", "target_length": 512},
    "quantization": {"mode": "nf4"},
    "lora": {"r": 4, "alpha": 8},
    "data": {"path": "builtin:stdlib", "max_documents": 10, "validation_fraction": 0.2, "num_proc": 1},
    "train": {
        "seq_len": 512,
        "micro_batch_size": 2,
        "max_steps": 4,
        "learning_rate": 2e-3,
        "warmup_steps": 1,
        "loss_chunk_size": 256,
    },
    # The tests that calibrate do it with `ctxext calibrate`; the default (calibrate after training when it is
    # cheap) is tested on its own (tests/unit/calibration/test_calibration.py), so no run here depends on timing.
    "calibrate": {"when": "never"},
}


def deep_update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with nested ``changes`` applied."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def write_recipe(path: Path, output_dir: Path, **sections: dict[str, Any]) -> Path:
    """Write a recipe YAML based on :data:`BASE_RECIPE` with section overrides."""
    data = deep_update(BASE_RECIPE, sections)
    data["output"] = {"dir": str(output_dir)}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# A full fine-tune of the tiny Llama of the fixtures (context 256) at 2x its context; no lora section (it has none).
FULL_RECIPE: dict[str, Any] = {
    "model": {"path": "builtin:tiny-llama"},
    "rope": {"method": "yarn", "target_length": 512},
    "data": {"path": "builtin:stdlib", "max_documents": 10, "validation_fraction": 0.2, "num_proc": 1},
    "train": {
        "mode": "full",
        "seq_len": 512,
        "micro_batch_size": 2,
        "max_steps": 3,
        "learning_rate": 1e-3,
        "warmup_steps": 1,
        "loss_chunk_size": 256,
        "eval_batches": 1,
    },
}


def write_full_recipe(tmp_path: Path, name: str, **sections: dict[str, Any]) -> Path:
    """``tmp_path/NAME.yaml``: :data:`FULL_RECIPE` with section overrides, its output ``tmp_path/NAME``."""
    data = deep_update(FULL_RECIPE, sections)
    data["output"] = {"dir": str(tmp_path / name)}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def head_shape_model(folder: Path, heads: int, kv_heads: int, head_dim: int) -> Path:
    """A random tiny Llama (2 layers, hidden = heads × head dim) with the built-in tiny Llama's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from ctxext.models.sources import resolve_model_path

    tiny = resolve_model_path("builtin:tiny-llama")
    config = AutoConfig.from_pretrained(tiny)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = heads, kv_heads, head_dim
    config.hidden_size = heads * head_dim  # transformers requires a multiple of the heads
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(folder)
    return folder


def env(**extra: str) -> dict[str, str]:
    """The environment of a training subprocess: offline, one thread (deterministic), the test cache."""
    out = dict(os.environ)
    # COLUMNS: rich wraps messages at the terminal width; wide enough keeps each message on one line.
    out.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "400"})
    out.pop("WORLD_SIZE", None)
    out.update(extra)
    return out


def ctxext_cmd(*args: str) -> list[str]:
    """``python -m ctxext ARGS`` with this interpreter."""
    return [sys.executable, "-m", "ctxext", *args]


def free_port() -> int:
    """A TCP port nothing listens on now (launches from parallel test workers must not share one)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accelerate_cmd(num_processes: int, *args: str) -> list[str]:
    """``accelerate launch --multi_gpu --num_processes N -m ctxext ARGS``."""
    launcher = Path(sys.executable).with_name("accelerate")
    return [
        str(launcher),
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "ctxext",
        *args,
    ]


def node_cmd(node: int, nodes: int, processes: int, port: int, *args: str) -> list[str]:
    """``accelerate launch`` of machine ``node`` of ``nodes`` (``processes`` in all), the main one on localhost."""
    cmd = accelerate_cmd(processes, *args)
    at = cmd.index("--num_machines")
    cmd[at : at + 2] = ["--num_machines", str(nodes), "--machine_rank", str(node), "--main_process_ip", "127.0.0.1"]
    cmd[cmd.index("--main_process_port") + 1] = str(port)
    return cmd


def run(cmd: list[str], timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    """Run a command from the repository root and capture its output."""
    return subprocess.run(cmd, cwd=ROOT, env=env(**extra_env), capture_output=True, text=True, timeout=timeout)


def adapter_tensors(run_dir: Path) -> dict[str, Any]:
    """The tensors of a run's ``adapter_model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter_model.safetensors"))


def write_fake_run(run_dir: Path, base: Path, status: str = "complete") -> Path:
    """A run folder that looks trained (``run.json`` on ``base``, YaRN to 1,024 from 256, an adapter config) for
    commands that refuse or advise before they read weights; nothing here trains."""
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {
        "status": status,
        "base_model": str(base),
        "base_model_resolved": str(base),
        "method": "yarn",
        "target_length": 1024,
        "original_length": 256,
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    (run_dir / "adapter_config.json").write_text("{}")
    return run_dir
