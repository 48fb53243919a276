"""Calibration after a fine-tune: settings chosen by measuring the trained run on held-out text."""
