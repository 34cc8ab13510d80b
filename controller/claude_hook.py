"""The module Claude Code runs on every hook event: ``tillerman hooks install --claude``
writes ``python -m tillerman.controller.claude_hook --spool DIR`` into the user's
``settings.json``, and every version before the hook moved to
``tillerman.controller.claude.hook`` wrote the same line. Settings outlive upgrades, so
this path stays: it only hands the arguments to the hook where it lives now."""

import sys

from tillerman.controller.claude.hook import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
