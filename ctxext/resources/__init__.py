"""Files ctxext ships: the demo suite, the grown models, bundled Hub configs."""

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent
