"""Bounded reads of the CLI's input files (``--launcher FILE``, ``verify RECEIPT``, ``--config PATH``).

Issue 9: ``--launcher -``, ``verify -``, ``/dev/zero`` and FIFOs were read without limit
(3.8-4.1 GB, hangs). The rule here, checked *before* a byte is read:

* only a regular file (or ``-`` for stdin) is read; a directory, FIFO, socket, character or block
  device (``/dev/zero``, ``/dev/null``, a terminal) is refused by its ``stat`` type. The file is
  opened with ``O_NONBLOCK`` and checked with ``fstat`` on the open descriptor, so opening a FIFO
  never blocks and a path swapped between check and read is still checked;
* a regular file whose size is over ``limit`` is refused from its ``stat`` size; the read itself
  asks for at most ``limit + 1`` bytes, so a file that grows meanwhile is still caught;
* stdin is read in chunks up to ``limit + 1`` bytes (a pipe has no size to check first); an
  interactive terminal on stdin is refused rather than waited on;
* the text must be UTF-8 (a BOM is accepted): the first invalid byte is named.

Every failure is :class:`InputError` (a ``ValueError``) with a one-line message naming the file
(``what`` and the path) and the fix, for exit code 2 without a traceback.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import BinaryIO

_CHUNK = 1 << 16


class InputError(ValueError):
    """An input file that cannot be read completely and safely; the message is one line."""


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for the message (None for a regular file)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _too_large(what: str, name: str, size: str, limit: int) -> InputError:
    return InputError(f"{what} {name} is {size}; the limit is {limit:,} bytes - pass a smaller file")


def _read_at_most(stream: BinaryIO, limit: int, what: str, name: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = stream.read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise _too_large(what, name, "larger than that", limit)
    return b"".join(chunks)


def _read_stdin(limit: int, what: str) -> bytes:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream stands in for stdin (an embedding program, the tests)
        text = sys.stdin.read(limit + 1)
        data = text.encode("utf-8", "surrogatepass")
        if len(text) > limit or len(data) > limit:
            raise _too_large(what, "(standard input)", "larger than that", limit)
        return data
    try:
        if stream.isatty():
            raise InputError(f"{what} - reads standard input, which is a terminal; pipe the file in "
                             f"(... < FILE) or pass its path")
        return _read_at_most(stream, limit, what, "(standard input)")
    except OSError as exc:
        raise InputError(f"cannot read {what} from standard input: {exc.strerror or exc}") from None


def _read_file(path: str, limit: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc} - check the path") from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:
            raise InputError(f"{what} {path} is {kind}, not a regular file; pass a file "
                             "(or - for standard input)")
        if st.st_size > limit:
            raise _too_large(what, path, f"{st.st_size:,} bytes", limit)
        with os.fdopen(fd, "rb", closefd=False) as stream:
            return _read_at_most(stream, limit, what, path)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_bounded(path_or_dash: str, *, limit: int, what: str) -> bytes:
    """The bytes of a regular file (or of stdin for ``-``), at most ``limit`` bytes.

    Raises :class:`InputError` for anything else: a missing or unreadable file, a directory,
    FIFO, device or socket, or more than ``limit`` bytes."""
    if path_or_dash == "-":
        return _read_stdin(limit, what)
    return _read_file(path_or_dash, limit, what)


def decode_utf8(data: bytes, *, what: str, name: str) -> str:
    """``data`` as UTF-8 text (a leading BOM dropped); :class:`InputError` names the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {name} is not UTF-8 text: byte {exc.start} (0x{data[exc.start]:02x}) "
                         "is invalid - save the file as UTF-8") from None


def read_text_bounded(path_or_dash: str, *, limit: int, what: str) -> str:
    """:func:`read_bounded` then :func:`decode_utf8`: the CLI's one call per text input."""
    data = read_bounded(path_or_dash, limit=limit, what=what)
    return decode_utf8(data, what=what, name="(standard input)" if path_or_dash == "-" else path_or_dash)
