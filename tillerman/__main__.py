"""``python -m tillerman``: the ``tillerman`` command."""

from tillerman.controller.cli.main import main

main()
