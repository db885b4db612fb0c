"""``python -m tfshard``: the same as the ``tfshard`` command."""

from .cli import main

main()
