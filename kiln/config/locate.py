"""Where a key is written in a TOML file, for error messages that name a line.

Neither tomllib nor tomlkit keeps line numbers, so :func:`key_lines` scans the text once
and records the line of every table header ``[a.b]``, array-of-tables entry ``[[a.b]]``
(by its index: ``a.b.0``, ``a.b.1``), key ``k = ...`` (dotted keys too), key of an
inline table, and item of an array. Paths are the ones pydantic's errors carry:
``("build", "system", 0, "header")``. :func:`line_of` falls back to the nearest
enclosing key or table that is written (a missing key: its table's line).

Not a TOML parser: it is run on text tomllib has already accepted, and on anything it
does not understand it moves on rather than fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

KeyPath = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_SPACE = " \t"
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def key_lines(text: str) -> dict[KeyPath, int]:
    """The 1-based line on which each key path of ``text`` is first written."""
    return _Scanner(text).scan()


def line_of(lines: Mapping[KeyPath, int], path: Sequence[str | int]) -> int | None:
    """The line of ``path``, else of the closest enclosing path that is written, else None."""
    for end in range(len(path), 0, -1):
        line = lines.get(tuple(path[:end]))
        if line is not None:
            return line
    return None


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.tables: dict[KeyPath, int] = {}  # array of tables -> entries so far

    # ---------------------------------------------------------------- characters

    def _peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.text[i] if i < len(self.text) else ""

    def _advance(self, n: int = 1) -> None:
        chunk = self.text[self.pos : self.pos + n]
        self.line += chunk.count("\n")
        self.pos += len(chunk)

    def _skip_space(self, newlines: bool = False) -> None:
        """Spaces (and, inside arrays, newlines and comments)."""
        while self.pos < len(self.text):
            c = self._peek()
            if c in _SPACE or (newlines and c in "\r\n"):
                self._advance()
            elif newlines and c == "#":
                self._skip_line()
            else:
                return

    def _skip_line(self) -> None:
        end = self.text.find("\n", self.pos)
        self._advance((len(self.text) if end < 0 else end) - self.pos)

    # ---------------------------------------------------------------- the document

    def scan(self) -> dict[KeyPath, int]:
        table: KeyPath = ()
        while self.pos < len(self.text):
            self._skip_space(newlines=True)
            if self.pos >= len(self.text):
                break
            line = self.line
            if self._peek() == "[":
                table = self._header(line)
            else:
                parts = self._key()
                if not parts:  # not a key: move on
                    self._skip_line()
                    continue
                self._record(table, parts, line)
                self._skip_space()
                if self._peek() == "=":
                    self._advance()
                    self._skip_space()
                    self._value(table + parts)
            self._skip_line()  # a comment, or what is left of a line not understood
        return self.lines

    def _header(self, line: int) -> KeyPath:
        array = self._peek(1) == "["
        self._advance(2 if array else 1)
        self._skip_space()
        parts = self._key()
        if not parts:
            return ()
        if not array:
            path = self._resolve(parts)
            for end in range(1, len(path)):
                self.lines.setdefault(path[:end], line)
            self.lines[path] = line  # an explicit [a] wins over the [a.b] before it
            return path
        base = (*self._resolve(parts[:-1]), parts[-1])
        index = self.tables.get(base, 0)
        self.tables[base] = index + 1
        for end in range(1, len(base) + 1):
            self.lines.setdefault(base[:end], line)
        self.lines[(*base, index)] = line
        return (*base, index)

    def _resolve(self, parts: KeyPath) -> KeyPath:
        """A header's path, with the current entry of each array of tables on the way
        (``[a.b]`` after ``[[a]]`` is ``a.<last>.b``)."""
        path: KeyPath = ()
        for part in parts:
            path = (*path, part)
            if path in self.tables:
                path = (*path, self.tables[path] - 1)
        return path

    def _record(self, prefix: KeyPath, parts: KeyPath, line: int) -> None:
        for end in range(1, len(parts) + 1):
            self.lines.setdefault((*prefix, *parts[:end]), line)

    # ---------------------------------------------------------------- keys and values

    def _key(self) -> KeyPath:
        """A (dotted) key: bare, "basic" or 'literal' parts; () where there is none."""
        parts: list[str | int] = []
        while True:
            self._skip_space()
            c = self._peek()
            if c in "\"'":
                parts.append(self._string())
            else:
                m = _BARE.match(self.text, self.pos)
                if not m:
                    return tuple(parts)
                parts.append(m.group())
                self._advance(len(m.group()))
            self._skip_space()
            if self._peek() != ".":
                return tuple(parts)
            self._advance()

    def _string(self) -> str:
        """A one-line string at pos, its escapes decoded well enough for a key."""
        quote = self._peek()
        self._advance()
        out: list[str] = []
        while self.pos < len(self.text) and self._peek() not in (quote, "\n"):
            c = self._peek()
            if c == "\\" and quote == '"':
                out.append(_ESCAPES.get(self._peek(1), self._peek(1)))
                self._advance(2)
            else:
                out.append(c)
                self._advance()
        self._advance()  # the closing quote
        return "".join(out)

    def _value(self, path: KeyPath) -> None:
        c = self._peek()
        if c == "[":
            self._array(path)
        elif c == "{":
            self._inline_table(path)
        elif self.text.startswith(('"""', "'''"), self.pos):
            self._multiline_string()
        elif c in "\"'":
            self._string()
        else:  # a number, a date, true/false: up to what ends it
            while self.pos < len(self.text) and self._peek() not in ",]}#\r\n":
                self._advance()

    def _array(self, path: KeyPath) -> None:
        self._advance()  # [
        index = 0
        while self.pos < len(self.text):
            self._skip_space(newlines=True)
            c = self._peek()
            if c == "]":
                self._advance()
                return
            if c == ",":
                index += 1
                self._advance()
                continue
            start = self.pos
            self.lines.setdefault((*path, index), self.line)
            self._value((*path, index))
            if self.pos == start:  # not understood: step over it
                self._advance()

    def _inline_table(self, path: KeyPath) -> None:
        self._advance()  # {
        while self.pos < len(self.text):
            self._skip_space(newlines=True)
            c = self._peek()
            if c == "}":
                self._advance()
                return
            if c == ",":
                self._advance()
                continue
            start, line = self.pos, self.line
            parts = self._key()
            if parts:
                self._record(path, parts, line)
                self._skip_space()
                if self._peek() == "=":
                    self._advance()
                    self._skip_space()
                    self._value((*path, *parts))
            if self.pos == start:
                self._advance()

    def _multiline_string(self) -> None:
        quote = self._peek()
        self._advance(3)
        while self.pos < len(self.text):
            if quote == '"' and self._peek() == "\\":
                self._advance(2)
            elif self.text.startswith(quote * 3, self.pos):
                self._advance(3)
                while self._peek() == quote:  # up to two quotes may end the content
                    self._advance()
                return
            else:
                self._advance()
