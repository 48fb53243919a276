"""Reading a YAML file the user wrote: a key given twice in one mapping is an error, not "the last one wins".

PyYAML (like the YAML spec's loaders in general) keeps the last value of a repeated key without a word, so a
recipe that sets ``train.max_steps`` twice trains with whichever comes last. :func:`load_yaml` finds every
repeated key first, with its dotted path and both line numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """Keys given twice in one mapping; ``duplicates`` holds ``(dotted key, first line, repeated line)``."""

    def __init__(self, duplicates: list[tuple[str, int, int]]):
        self.duplicates = duplicates
        super().__init__("; ".join(f"{key}: given twice (lines {a} and {b})" for key, a, b in duplicates))


def _duplicates(node: yaml.Node, path: str, found: list[tuple[str, int, int]]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            dotted = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            if key is not None and key != "<<":  # "<<" is a merge key: it may repeat
                if key in seen:
                    found.append((dotted, seen[key], line))
                else:
                    seen[key] = line
            _duplicates(value_node, dotted, found)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _duplicates(item, f"{path}.{i}" if path else str(i), found)


def load_yaml(text: str) -> Any:
    """Parse YAML text like ``yaml.safe_load``, refusing keys given twice in one mapping.

    Args:
        text: the YAML document.

    Returns:
        The parsed data (``None`` for an empty document).

    Raises:
        DuplicateKeyError: every repeated key, by dotted path (list items by index) and line.
        yaml.YAMLError: text that is not YAML.
    """
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is not None:
        found: list[tuple[str, int, int]] = []
        _duplicates(node, "", found)
        if found:
            raise DuplicateKeyError(found)
    return yaml.safe_load(text)


def read_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file the user wrote (a recipe, an eval suite) with :func:`load_yaml`.

    Raises:
        DuplicateKeyError: keys given twice.
        yaml.YAMLError: text that is not YAML, a file that is not UTF-8 text (a binary file given by mistake) or
            cannot be read; the message names the file.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise yaml.YAMLError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); give the YAML file itself"
        ) from None
    except OSError as exc:
        raise yaml.YAMLError(f"cannot read {path} ({exc.strerror or exc})") from None
    return load_yaml(text)
