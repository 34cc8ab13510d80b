"""``python -m tillerman``: the ``tillerman`` command."""

from tillerman.controller.cli import main

main()
