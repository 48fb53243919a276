"""``ForwardClock``: the time of one forward on this machine, scaled to other lengths: the fastest of a few timings."""

from __future__ import annotations

import time

from transformers import AutoModelForCausalLM

from ctxext.models.cost import ForwardClock


def test_the_clock_keeps_the_fastest_timing_so_one_stalled_forward_does_not_inflate_an_estimate(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    forward, calls = model.forward, []

    def stalled_once(*args, **kwargs):
        # The first timed forward (after the short warm-up) stalls, as one does on cores another job holds.
        calls.append(kwargs["input_ids"].shape[1])
        if len(calls) == 2:
            time.sleep(1.0)
        return forward(*args, **kwargs)

    model.forward = stalled_once
    clock = ForwardClock.measure(model, 32)
    assert calls == [8, 32, 32, 32]
    assert 0 < clock.seconds < 0.5  # not the stalled 1 s
    assert clock.seconds_at(128) > clock.seconds  # scaled by the forward's FLOPs
