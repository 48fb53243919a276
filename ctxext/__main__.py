"""``python -m ctxext`` (used by ``accelerate launch -m ctxext train …``)."""

from ctxext.cli.commands import main

main()
