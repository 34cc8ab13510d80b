"""TOML source text: parsed with line-accurate syntax errors, and the line of a table or key.

tomllib reports positions only for syntax errors, so for a file that parses but does
not validate the line is found in the source text: the Nth ``[[rule]]`` header, then
the key inside that table (inline, dotted, or in a ``[rule.condition]`` sub-table).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from tillerman.rules.errors import RuleSetError

_TOML_POSITION = re.compile(r"(?P<what>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)")


def parse_toml(text: str, source: str) -> dict[str, Any]:
    import tomllib  # only for a rule or config file: the built-in rules come compiled

    try:
        return tomllib.loads(text)
    except RecursionError:
        line = _deepest_line(text)
        raise RuleSetError(f"{source}:{line}: invalid TOML: arrays or tables nested too deeply; "
                           "rule and config files need a few levels at most") from None
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = _TOML_POSITION.fullmatch(message)
        if where is None:  # "(at end of document)"
            line, what = text.count("\n") + 1, message.replace(" (at end of document)", " at the end")
        else:
            line, what = int(where["line"]), f"{where['what']} at column {where['column']}"
        hint = 'strings need quotes, e.g. status = "active"' if what.startswith("Invalid value") else "fix the syntax there"
        raise RuleSetError(f"{source}:{line}: invalid TOML: {what}; {hint}") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        digits = re.search(r"[0-9_]{%d,}" % (sys.get_int_max_str_digits() + 1), text)
        line = text.count("\n", 0, digits.start()) + 1 if digits else 1
        raise RuleSetError(f"{source}:{line}: invalid TOML: a number of more than {sys.get_int_max_str_digits()} digits;"
                           " write a smaller one") from None


def _deepest_line(text: str) -> int:
    """The line where brackets first nest deepest: where a too-deep nesting is. Brackets
    in strings and comments count too: a guess, for an error message."""
    depth, deepest, line, at = 0, 0, 1, 1
    for char in text:
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest, at = depth, line
        elif char in "]}":
            depth -= 1
        elif char == "\n":
            line += 1
    return at



# -- finding the line of a table or key in TOML source --------------------------------------

_HEADER = re.compile(r"\s*\[(\[)?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
#: One key of a table header: a quoted one may hold dots (``[prices."gpt-5.5"]``).
_HEADER_KEY = re.compile(r"\"[^\"]*\"|'[^']*'|[^.\"']+")


def locate(text: str, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the deepest part of ``loc`` found in the source: the key's
    own line, else its parent's, else the ``[[array]]`` header, else line 1.

    ``loc`` is (array name, index, key, key, …) or (top-level key,). Lines inside
    multi-line strings are not told apart from keys: a good-enough guess there.
    """
    lines = text.splitlines()
    tables = sections(lines)
    if len(loc) >= 2 and isinstance(loc[1], int):
        array, index = loc[0], loc[1]
        headers = [i for i, (_, path, is_array) in enumerate(tables) if is_array and path == (array,)]
        if index >= len(headers):
            return 1
        start = headers[index]
        end = next((i for i in range(start + 1, len(tables)) if tables[i][2] and tables[i][1] == (array,)), len(tables))
        owned = [(first, path[1:]) for first, path, _ in tables[start:end] if path[:1] == (array,)]
        header_line, keys = tables[start][0] + 1, _keys_until_index(loc[2:])
    else:
        owned = [(first, path) for first, path, _ in tables]
        header_line, keys = 1, _keys_until_index(loc)
    for depth in range(len(keys), 0, -1):
        line = _find_key(lines, tables, owned, keys[:depth])
        if line is not None:
            return line
    return header_line


def _keys_until_index(parts: tuple[Any, ...]) -> tuple[str, ...]:
    """Keys up to the first list index: an array's elements have no keys of their own."""
    keys: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            break
        keys.append(part)
    return tuple(keys)


def sections(lines: list[str]) -> list[tuple[int, tuple[str, ...], bool]]:
    """(0-based first line, table path, is array-of-tables) for each table; the
    top-level table (before any header) first, with path ()."""
    sections: list[tuple[int, tuple[str, ...], bool]] = [(-1, (), False)]
    for number, line in enumerate(lines):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("#"):
            path = tuple(part.strip().strip("\"'") for part in _HEADER_KEY.findall(header[2]))
            sections.append((number, path, bool(header[1])))
    return sections


def _find_key(
    lines: list[str],
    sections: list[tuple[int, tuple[str, ...], bool]],
    owned: list[tuple[int, tuple[str, ...]]],
    keys: tuple[str, ...],
) -> int | None:
    """The line defining ``keys`` in one of the ``owned`` sections (given as first
    line and path relative to the table ``keys`` is relative to): a sub-table
    header, or a (dotted) key in a section that is a prefix of ``keys``; a key
    defined through dotted sub-keys is found at its first one."""
    firsts = [first for first, _, _ in sections]
    for first, prefix in owned:
        if prefix == keys and first >= 0:
            return first + 1
        if keys[: len(prefix)] != prefix or len(keys) == len(prefix):
            continue
        rest = keys[len(prefix):]
        key = re.compile(r"\s*" + r"\s*\.\s*".join(rf"[\"']?{re.escape(k)}[\"']?" for k in rest) + r"\s*[=.]")
        end = next((f for f in firsts if f > first), len(lines))
        for number in range(first + 1, end):
            if key.match(lines[number]):
                return number + 1
    return None
