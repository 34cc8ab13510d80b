"""Text that came from outside tillerman, made safe to show on a terminal.

A thread id, a file name, a command or an agent message is whatever the agent's side
wrote, and a terminal obeys the control characters in it: ESC ] 52 writes the
clipboard, ESC [ 2 J clears the screen, a newline in a thread id forges a line of
``status``, a bidi override shows text in an order it was not written in.
``printable`` shows each such character as its code instead, so the text reads as
itself and nothing in it acts on the terminal. Every human output path prints outside
text through it; ``--json`` output is left exact (its encoder escapes what JSON must).
"""

from __future__ import annotations

import re

#: Unicode's control characters (C0, DEL, C1) and its Bidi_Control characters.
_SHOWN_AS_CODE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _code(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def printable(value: object) -> str:
    """``value`` as text with every control and bidi control character written as its
    code (``\\x1b``, ``\\n``, ``\\x9b``, ``\\u202e``): one line that shows which character
    was there, never one that moves the cursor or changes the terminal. A backslash is
    left as written, so paths, patterns and ``repr``-quoted values read as they are."""
    return _SHOWN_AS_CODE.sub(_code, str(value))
