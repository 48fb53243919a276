"""The chunked cross-entropy equals plain cross-entropy (values and gradients) and uses less memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from ctxext.training.losses import chunked_cross_entropy


def _inputs(n=300, h=16, v=97, dtype=torch.float64, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, dtype=dtype, generator=g, requires_grad=True)
    weight = torch.randn(v, h, dtype=dtype, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=dtype, generator=g, requires_grad=True) if bias else None
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::7] = -100
    return hidden, weight, b, labels


@pytest.mark.parametrize("chunk", [1, 64, 299, 300, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_equals_plain_values_and_grads(chunk, bias):
    hidden, weight, b, labels = _inputs(bias=bias)
    plain = F.cross_entropy(F.linear(hidden, weight, b), labels, ignore_index=-100)
    grads_plain = torch.autograd.grad(plain, [hidden, weight] + ([b] if bias else []))
    ours = chunked_cross_entropy(hidden, weight, labels, bias=b, chunk_size=chunk)
    grads_ours = torch.autograd.grad(ours, [hidden, weight] + ([b] if bias else []))
    # The loss accumulates in float32; gradients in the input dtype (float64 here).
    assert ours.item() == pytest.approx(plain.item(), rel=1e-6)
    for gp, go in zip(grads_plain, grads_ours, strict=True):
        torch.testing.assert_close(go.double(), gp.double(), rtol=1e-5, atol=1e-7)


def test_sum_reduction_and_all_ignored():
    hidden, weight, _, labels = _inputs()
    plain = F.cross_entropy(F.linear(hidden, weight), labels, ignore_index=-100, reduction="sum")
    assert chunked_cross_entropy(hidden, weight, labels, reduction="sum").item() == pytest.approx(
        plain.item(), rel=1e-6
    )
    ignored = torch.full_like(labels, -100)
    loss = chunked_cross_entropy(hidden, weight, ignored, chunk_size=50)
    assert loss.item() == 0.0
    (gh,) = torch.autograd.grad(loss, [hidden])
    assert torch.count_nonzero(gh) == 0


def test_float32_and_second_call_gradcheck():
    hidden, weight, _, labels = _inputs(n=12, h=4, v=9)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_cross_entropy(h, w, labels, chunk_size=5).double(), (hidden, weight)
    )
    h32, w32, _, lab = _inputs(dtype=torch.float32, seed=3)
    plain = F.cross_entropy(F.linear(h32, w32), lab)
    ours = chunked_cross_entropy(h32, w32, lab, chunk_size=37)
    assert ours.item() == pytest.approx(plain.item(), rel=1e-5)


_MEMORY_PROBE = textwrap.dedent(
    """
    import json, sys
    import torch, torch.nn.functional as F
    from ctxext.training.losses import chunked_cross_entropy
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n, h, v = 2048, 64, 8000
    hidden = torch.randn(n, h, requires_grad=True)
    weight = torch.randn(v, h, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1])
    try:  # reset the peak (VmHWM) to the current resident size, so that earlier spikes do not count
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = status("VmRSS:")
    if sys.argv[1] == "plain":
        loss = F.cross_entropy(F.linear(hidden, weight).float(), labels)
    else:
        loss = chunked_cross_entropy(hidden, weight, labels, chunk_size=128)
    loss.backward()
    after = status("VmHWM:")
    print(json.dumps({"peak_delta_kb": after - before, "loss": loss.item()}))
    """
)


def _peak(kind: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, kind], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_chunked_peak_memory_is_lower():
    # Each variant runs in a fresh process; the rise of its peak resident memory over the inputs is
    # what the loss and its backward allocated at most (the logits are 2048 × 8000 × 4 B = 65 MB).
    plain = _peak("plain")
    chunked = _peak("chunked")
    assert chunked["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    logits_kb = 2048 * 8000 * 4 / 1024
    assert plain["peak_delta_kb"] > logits_kb  # the plain loss really holds the full logits
    assert chunked["peak_delta_kb"] < 0.35 * plain["peak_delta_kb"], (plain, chunked)


def test_a_tokens_weight_does_not_depend_on_its_micro_batch():
    # Row A beside a fully scored row, then beside an answer-only row (3 scored tokens): under
    # micro_batch_loss the gradient reaching row A's hidden states is the same; under a mean over the
    # micro-batch's scored tokens it would not be.
    from ctxext.training.losses import micro_batch_loss

    torch.manual_seed(0)
    t, h, vocab = 16, 8, 32
    weight = torch.randn(vocab, h)
    row_a = torch.randint(0, vocab, (t,))
    full = torch.randint(0, vocab, (t,))
    answer_only = torch.full((t,), -100)
    answer_only[-4:-1] = full[-4:-1]
    states = torch.randn(2, t, h)
    grads = {}
    for name, other in {"full": full, "answer_only": answer_only}.items():
        for rule in ("positions", "scored"):
            hidden = states.clone().requires_grad_(True)
            labels = torch.stack([row_a, other])
            total = chunked_cross_entropy(hidden, weight, labels, chunk_size=8, reduction="sum")
            count = (labels != -100).sum()
            loss = micro_batch_loss(total, labels, 2) if rule == "positions" else total / count / 2
            loss.backward()
            grads[name, rule] = hidden.grad[0].clone()
    torch.testing.assert_close(grads["full", "positions"], grads["answer_only", "positions"], rtol=0, atol=0)
    assert not torch.allclose(grads["full", "scored"], grads["answer_only", "scored"])
    # Each scored token weighs 1 / (positions × accumulation): row A's gradient is its own sum's, scaled.
    alone = states[:1].clone().requires_grad_(True)
    chunked_cross_entropy(alone, weight, row_a[None], chunk_size=8, reduction="sum").backward()
    torch.testing.assert_close(grads["full", "positions"], alone.grad[0] / (2 * t) / 2)
