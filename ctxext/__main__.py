"""``python -m ctxext`` (used by ``accelerate launch -m ctxext train …``)."""

from ctxext.cli import main

main()
