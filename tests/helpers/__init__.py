"""What the tests share: tiny models (:mod:`.tiny`), training runs (:mod:`.train`), evaluation fixtures
(:mod:`.evaluation`), published runs (:mod:`.hub`), GGUF files (:mod:`.gguf_files`), the toy plugins, the
fresh-interpreter workers, and the quick tier's measured edge (:mod:`.durations`)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
