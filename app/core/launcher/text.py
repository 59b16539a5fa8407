"""Limits, decoding and the small text helpers every rule of the reader shares."""

from __future__ import annotations

import itertools

MAX_LAUNCHER_BYTES = 1 << 20
MAX_TOTAL_BYTES = 4 * MAX_LAUNCHER_BYTES   # the launcher and every file it sources, together
MAX_SOURCE_DEPTH = 8
MAX_DEPTH = 32           # nesting of ${...}, $((...)), arithmetic parentheses and variable lookups
MAX_VALUE = 1 << 16      # characters in one expanded value
MAX_ITEMS = 10_000       # elements kept in one array
MAX_ARITH = 4096         # characters in one arithmetic expression
#: work units charged for each flag occurrence a ``$VAR`` / ``${ARR[@]}`` splices into a command
#: line or an array (issue 20 finding 6: 3,000 flags spliced 3,000 times must not be 9 M records)
SPLICE_COST = 64
TOO_LONG = f"the value is longer than {MAX_VALUE} characters"
TOO_COMPLEX = "the script is too complex to expand (work limit reached)"


class LauncherError(ValueError):
    """The launcher cannot be read completely, so no verdict may be given (exit 2): too large, not
    UTF-8 text, empty, no trainer invocation, unterminated syntax, the expansion budget hit, a
    parallel size of 0, or a sourced file that is missing (named in ``missing``)."""

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


def short(s: str, limit: int = 60) -> str:
    s = " ".join(s.replace("\\\n", " ").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def where(file: str, line: int) -> str:
    """``file:line``, or ``line N`` for the pasted launcher itself (no file name)."""
    return f"{file}:{line}" if file else f"line {line}"


def line_starts(text: str) -> list[int]:
    return [0, *itertools.accumulate(len(p) + 1 for p in text.split("\n")[:-1])]


def decode(data: str | bytes, name: str) -> str:
    """The text of one file: at most :data:`MAX_LAUNCHER_BYTES`, UTF-8, CRLF read as LF."""
    if isinstance(data, (bytes, bytearray)):
        size, unit = len(data), "bytes"
    elif isinstance(data, str):   # counting characters first avoids encoding a huge string
        size, unit = (len(data), "characters") if len(data) > MAX_LAUNCHER_BYTES else \
            (len(data.encode("utf-8", "surrogatepass")), "bytes")
    else:
        raise TypeError(f"parse_launcher() wants str or bytes, not {type(data).__name__}")
    if size > MAX_LAUNCHER_BYTES:
        raise LauncherError(f"the launcher script {name} is {size} {unit}, "
                            f"over the limit of {MAX_LAUNCHER_BYTES} bytes")
    if not isinstance(data, str):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LauncherError(f"the launcher script {name} is not UTF-8 text "
                                f"(bad byte at offset {exc.start})") from None
    return data.removeprefix("\ufeff").replace("\r\n", "\n")


def text_file(data: str | bytes, name: str) -> str:
    """:func:`decode`, then refuse binary data (a NUL byte) and an empty file."""
    text = decode(data, name)
    if "\x00" in text:
        raise LauncherError(f"{name} holds binary data (a NUL byte), not a bash script")
    if not text.strip():
        raise LauncherError(f"{name} is empty")
    return text
