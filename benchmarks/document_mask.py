"""CPU cost of document-boundary masking (``data.document_mask``) in a training step.

The grown model (``builtin:grown-code-64``, fp32, SDPA) runs forward + backward of the training loss on
the same packed rows of training-split stdlib code, alternately

* without masking (the default causal path), and
* with masking: positions restarting per document and a 4D block-causal boolean mask
  (:func:`ctxext.training.data.rows.build_inputs`),

interleaved ``--repeats`` times in one process; the table gives tokens/s of both and their ratio
(median over repeats), at each ``--seq-lens``.

    python -m benchmarks.document_mask --seq-lens 256,1024 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-lens", default="256,1024", help="row lengths in tokens, comma-separated")
    parser.add_argument("--rows", type=int, default=8, help="rows per training step")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats; the median counts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxext.models.builtin import GROWN_DIR
    from ctxext.recipe.sections import DataSection
    from ctxext.training.data.corpus import prepare_data
    from ctxext.training.data.rows import build_inputs

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(GROWN_DIR)
    model = AutoModelForCausalLM.from_pretrained(GROWN_DIR, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    print("| seq_len | rows | documents per row (mean) | tokens/s plain | tokens/s masked | masked / plain |")
    print("|---|---|---|---|---|---|")
    for seq in [int(x) for x in args.seq_lens.split(",")]:
        section = DataSection(path="builtin:stdlib", max_documents=300, document_mask=True, validation_fraction=0)
        data = prepare_data(section, tok, seq)
        rows = data.train[: args.rows]
        docs = float((rows["segments"][:, -1] + 1).float().mean())
        variants = {
            "plain": build_inputs({"input_ids": rows["input_ids"]}, attn_implementation="sdpa"),
            "masked": build_inputs(rows, attn_implementation="sdpa"),
        }
        speed: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.repeats + 1):
            for name, inputs in variants.items():
                started = time.perf_counter()
                out = model(
                    input_ids=inputs.input_ids,
                    position_ids=inputs.position_ids,
                    attention_mask=inputs.attention_mask,
                    labels=None,
                    use_cache=False,
                )
                loss = torch.nn.functional.cross_entropy(
                    out.logits.flatten(0, 1), inputs.labels.flatten(), ignore_index=-100
                )
                loss.backward()
                model.zero_grad(set_to_none=True)
                if r:  # the first round warms up
                    speed[name].append(inputs.input_ids.numel() / (time.perf_counter() - started))
        plain, masked = statistics.median(speed["plain"]), statistics.median(speed["masked"])
        print(f"| {seq} | {args.rows} | {docs:.1f} | {plain:,.0f} | {masked:,.0f} | {masked / plain:.2f} |")


if __name__ == "__main__":
    main()
