"""``python -m cairn`` is the ``cairn`` command."""

from cairn.cli.main import main

main()
