"""The one progress display: plain lines for logs, nothing for short work, nothing when disabled."""

from __future__ import annotations

import time

from ctxext.progress import progress


def test_without_a_terminal_a_line_every_n_units_and_a_last_line(capsys):
    with progress("train", 10, unit="step", every=3) as tracker:
        for step in range(1, 11):
            tracker.update(step, info=f"loss {1 / step:.3f}")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" · ")[0] for line in lines] == [
        "train: step 3/10 (30 %)",
        "train: step 6/10 (60 %)",
        "train: step 9/10 (90 %)",
        "train: step 10/10 (100 %)",
    ]
    assert "loss 0.333" in lines[0] and "ETA" in lines[0] and "ETA" not in lines[-1]


def test_short_work_prints_nothing_and_long_work_prints_by_time(capsys):
    with progress("quick", 5) as advance:
        for _ in range(5):
            advance()
    assert capsys.readouterr().err == ""
    with progress("slow", 4, interval_s=0.02) as advance:
        for _ in range(4):
            time.sleep(0.03)
            advance()
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[-1].startswith("slow: 4/4 (100 %)")


def test_disabled_prints_nothing_and_a_resumed_count_starts_where_it_was(capsys):
    with progress("train", 10, enabled=False, every=1) as tracker:
        tracker.update(10)
    assert capsys.readouterr().err == ""
    with progress("train", 10, unit="step", every=5, completed=5) as tracker:
        tracker.update(7)
        tracker.update(10)
    assert capsys.readouterr().err.splitlines()[0].startswith("train: step 10/10")


def test_a_resumed_runs_eta_counts_only_the_units_done_since_it_resumed(capsys):
    # 90 of 100 steps were done before this process; one step here takes ~1 s, so ~9 s are left. Counting the 90
    # as done in this process's time would say 0 s.
    with progress("train", 100, unit="step", every=1, completed=90) as tracker:
        time.sleep(1.0)
        tracker.update(91)
    eta = capsys.readouterr().err.split("ETA ")[1].strip()
    minutes, _, seconds = eta.rstrip("s").rpartition("m")
    assert 60 * int(minutes or 0) + int(seconds) >= 8, eta
