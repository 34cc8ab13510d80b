"""The error a rule or config file raises, and how its messages quote a value."""

from __future__ import annotations

import json


class RuleSetError(Exception):
    """A rule or config file that cannot be used; the message says where and how to fix it.

    A reload that raises this keeps the last good rule set.
    """


#: How much of a value an error message quotes.
SHOW_CHARS = 60


def show(value: object) -> str:
    """A value as an error quotes it: one line, at most about ``SHOW_CHARS`` characters."""
    try:
        text = json.dumps(value[: SHOW_CHARS + 1]) if isinstance(value, str) else str(value).replace("\n", " ")
    except ValueError:  # an integer of thousands of digits (Python refuses to print it)
        return "a number too large to show"
    return text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "…"
