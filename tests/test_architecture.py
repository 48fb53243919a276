"""Architecture rules that a refactor could silently break: a light CLI import."""

from __future__ import annotations

import subprocess
import sys


def test_cli_import_and_help_do_not_import_torch() -> None:
    # `ctxext --help` pays for every module the CLI imports at top level; torch alone costs seconds.
    code = (
        "import sys, ctxext, ctxext.cli\n"
        "from typer.testing import CliRunner\n"
        "assert CliRunner().invoke(ctxext.cli.app, ['--help']).exit_code == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
