"""Peak memory and speed of `ctxext train` versus a plain transformers `Trainer` + peft QLoRA script.

Both sides train the same model (a small random Llama with a 32k vocabulary, like Llama 2's), with the
same nf4 quantization, LoRA settings, gradient checkpointing, sequence length, batch size, steps and
data blocks, each in its own fresh process, one after the other in the same run. Printed and written
to ``benchmarks/results/train_memory.md``: peak resident memory (CPU) or peak allocated memory (CUDA),
tokens/s (median step, first step excluded), and the ratios ctxext / plain.

The plain script is what a user writes from the peft/transformers docs: ``BitsAndBytesConfig`` nf4,
``prepare_model_for_kbit_training``, ``get_peft_model``, ``Trainer`` with ``gradient_checkpointing=True``;
the RoPE patch comes from ``ctxext extend`` so both sides compute the same model. Its loss is
transformers' own (full-length float32 logits); ctxext's is the chunked cross-entropy.

Usage::

    nice -n 10 python -m benchmarks.train_memory --lengths 1024 2048 4096 8192 16384 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "train_memory.md"


def build_model(folder: Path, vocab: int, hidden: int, layers: int, context: int) -> None:
    """A small random Llama with a big vocabulary and a tokenizer of that size, saved to ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from ctxext.models.builtin import train_code_tokenizer

    tokenizer = train_code_tokenizer(vocab_size=vocab, max_bytes=3_000_000)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _peak_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _recipe(args: argparse.Namespace, length: int, out: Path):
    from ctxext.recipe.schema import parse_recipe

    return parse_recipe(
        {
            "model": {"path": str(args.model_dir)},
            "rope": {"method": "yarn", "target_length": length},
            "quantization": {"mode": "nf4"},
            "lora": {"r": 8, "alpha": 16, "extra_trainable": []},
            "data": {"path": "builtin:stdlib", "max_documents": args.documents, "validation_fraction": 0},
            "train": {
                "seq_len": length,
                "micro_batch_size": 1,
                "max_steps": args.steps,
                "learning_rate": 1e-4,
                "warmup_steps": 0,
                "loss_chunk_size": 1024,
                "gradient_checkpointing": True,
            },
            "output": {"dir": str(out)},
        }
    )


def worker_ctxext(args: argparse.Namespace) -> dict:
    """One `ctxext train` run in this process."""
    from ctxext.training.run import train

    with tempfile.TemporaryDirectory() as tmp:
        result = train(_recipe(args, args.length, Path(tmp) / "run"), command=["benchmark"])
        metrics = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [m["tokens_per_sec"] for m in metrics if m.get("step", 0) > 1] or [metrics[-1]["tokens_per_sec"]]
    return {"peak_mb": _peak_mb(), "tokens_per_sec": statistics.median(speeds), "final_loss": metrics[-1]["loss"]}


def worker_plain(args: argparse.Namespace) -> dict:
    """The plain Trainer + peft QLoRA script, on the same blocks."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        BitsAndBytesConfig,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
    )

    from ctxext.models.folder import extend_folder
    from ctxext.training.data.corpus import prepare_data

    recipe = _recipe(args, args.length, Path("unused"))
    with tempfile.TemporaryDirectory() as tmp:
        patched = Path(tmp) / "patched"
        extend_folder(str(args.model_dir), patched, "yarn", args.length)
        tokenizer = AutoTokenizer.from_pretrained(patched)
        blocks = prepare_data(recipe.data, tokenizer, args.length, seed=recipe.train.seed).train
        blocks = blocks.with_format(None).map(lambda b: {"labels": b["input_ids"]}, batched=True)
        cuda = torch.cuda.is_available()
        dtype = torch.bfloat16 if cuda else torch.float32
        model = AutoModelForCausalLM.from_pretrained(
            patched,
            quantization_config=BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            ),
            dtype=dtype,
            attn_implementation="sdpa",
            device_map={"": 0 if cuda else "cpu"},
        )
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
        model = get_peft_model(
            model,
            LoraConfig(
                r=8,
                lora_alpha=16,
                lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                task_type="CAUSAL_LM",
            ),
        )
        times: list[float] = []

        class StepTimer(TrainerCallback):
            def on_step_begin(self, *a, **k):
                self.t0 = time.perf_counter()

            def on_step_end(self, *a, **k):
                times.append(time.perf_counter() - self.t0)

        targs = TrainingArguments(
            output_dir=str(Path(tmp) / "out"),
            per_device_train_batch_size=1,
            max_steps=args.steps,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            gradient_checkpointing=True,
            gradient_checkpointing_kwargs={"use_reentrant": False},
            use_cpu=not cuda,
            bf16=False,
            dataloader_num_workers=0,
            disable_tqdm=True,
            seed=recipe.train.seed,
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=blocks,
            data_collator=default_data_collator,
            callbacks=[StepTimer()],
        )
        out = trainer.train()
    steady = times[1:] or times
    return {
        "peak_mb": _peak_mb(),
        "tokens_per_sec": args.length / statistics.median(steady),
        "final_loss": out.training_loss,
    }


WORKERS = {"ctxext": worker_ctxext, "plain": worker_plain}


def _spawn(kind: str, length: int, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        "-m",
        __spec__.name,
        "--worker",
        kind,
        "--length",
        str(length),
        "--model-dir",
        str(args.model_dir),
        "--steps",
        str(args.steps),
        "--documents",
        str(args.documents),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-1500:]
        return {"error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"}
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and write the Markdown table."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--documents", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print("RESULT " + json.dumps(WORKERS[args.worker](args)), flush=True)
        return

    from ctxext.models.builtin import cache_dir

    if args.model_dir is None:
        args.model_dir = cache_dir() / "benchmarks" / f"llama-v{args.vocab}-h{args.hidden}-l{args.layers}"
        if not (args.model_dir / "config.json").is_file():
            print(f"building {args.model_dir} (tokenizer with {args.vocab} tokens)…", flush=True)
            args.model_dir.mkdir(parents=True, exist_ok=True)
            build_model(args.model_dir, args.vocab, args.hidden, args.layers, context=512)

    rows = []
    header = (
        "| seq len | plain peak MB | ctxext peak MB | memory ratio | plain tok/s | ctxext tok/s | speed ratio |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    print(header, flush=True)
    for length in args.lengths:
        plain = _spawn("plain", length, args)
        ours = _spawn("ctxext", length, args)
        if "error" in plain or "error" in ours:
            row = f"| {length} | {plain.get('error', '')} | {ours.get('error', '')} | | | | |"
        else:
            row = (
                f"| {length} | {plain['peak_mb']:,.0f} | {ours['peak_mb']:,.0f} | "
                f"{ours['peak_mb'] / plain['peak_mb']:.2f}× | {plain['tokens_per_sec']:,.0f} | "
                f"{ours['tokens_per_sec']:,.0f} | {ours['tokens_per_sec'] / plain['tokens_per_sec']:.2f}× |"
            )
        rows.append(row)
        print(row, flush=True)

    import platform

    import torch

    from benchmarks._common import measured_on

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.processor() or 'x86_64'})"
    text = (
        "# ctxext train vs. plain Trainer + peft: peak memory and speed\n\n"
        f"Command: `python -m benchmarks.train_memory --lengths {' '.join(map(str, args.lengths))} "
        f"--steps {args.steps} --vocab {args.vocab} --hidden {args.hidden} --layers {args.layers} "
        f"--threads {args.threads}`\n\n"
        f"{measured_on()}\n\n"
        f"Device: {device}; {args.threads} thread(s) per run; each cell is a fresh process; both sides: nf4 "
        "double-quant base, LoRA r=8 on all projections, gradient checkpointing, batch 1, same data blocks. "
        f"Model: random Llama, hidden {args.hidden}, {args.layers} layers, vocabulary {args.vocab}. "
        "Peak memory is the process's peak resident set on CPU (imports and model included), peak allocated "
        "on CUDA. tokens/s is the median step after the first. Ratios are ctxext / plain (memory: lower is "
        "better; speed: higher is better). Target: memory ≤ 0.6× at 8k and 16k, speed ≥ 1.0×.\n\n"
        + header
        + "\n"
        + "\n".join(rows)
        + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
