"""``source FILE`` / ``. FILE``: the file (relative to the sourcing file's directory, as the
``SCRIPT_DIR`` idioms resolve) is read through a loader and interpreted in place, at most
:data:`~app.core.launcher.text.MAX_SOURCE_DEPTH` deep and :data:`~app.core.launcher.text.MAX_TOTAL_BYTES`
in all (a file sourced again counts again). Loaders: :func:`disk_loader` reads through
:func:`app.core.inputs.read_bounded` (regular files only, opened non-blocking: a FIFO, ``/dev/stdin``
or a device is refused by name - issue 20 finding 8), :func:`files_loader` from pasted files."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping

from app.core.inputs import InputError, read_bounded
from app.core.launcher.lexer import Token
from app.core.launcher.state import BUDGET_PER_CHAR, Loader, ShellState
from app.core.launcher.text import (
    MAX_LAUNCHER_BYTES,
    MAX_SOURCE_DEPTH,
    MAX_TOTAL_BYTES,
    LauncherError,
    line_starts,
    short,
    text_file,
    where,
)


class SourceRules(ShellState):
    def source(self, item: Token, pos: int) -> bool:
        """Interpret the file ``item`` names in place; False when it cannot be read."""
        at = where(self.file, self.line(pos))
        text, reason = self.expand(str(item[1])) if item[0] == "word" else ("", "not a file name")
        if reason or not text:
            self.missing.append(f"{short(str(item[1]), 60)} (sourced at {at}; {reason or 'empty name'})")
            return False
        path = text if posixpath.isabs(text) else posixpath.normpath(
            posixpath.join(posixpath.dirname(self.file) or ".", text))
        if self.depth >= MAX_SOURCE_DEPTH:
            self.fatal.append(f"{at}: source {path} nests deeper than {MAX_SOURCE_DEPTH} files")
            return False
        try:
            body = self.loader(path) if self.loader is not None else None
        except LauncherError as exc:
            raise LauncherError(f"{exc} (sourced at {at})") from None
        if body is None:
            self.missing.append(f"{path} (sourced at {at})")
            return False
        self.sourced += len(body)
        if self.sourced > MAX_TOTAL_BYTES:
            self.fatal.append(f"{at}: the sourced files add up to more than {MAX_TOTAL_BYTES} bytes")
            return True
        if self.grows and self.budget >= 0:
            self.budget += BUDGET_PER_CHAR * len(body)
        saved = (self.text, self.line_starts, self.file)
        self.text, self.line_starts, self.file = body, line_starts(body), path
        self.files.append(path)
        self.depth += 1
        try:
            self.run()
        finally:
            self.depth -= 1
            self.text, self.line_starts, self.file = saved
        return True


def disk_loader() -> Loader:
    """Read sourced files from disk, bounded: a path that does not exist is missing (None); one that
    exists but is not a readable regular file of at most :data:`MAX_LAUNCHER_BYTES` raises
    :class:`LauncherError` naming it; all reads together at most :data:`MAX_TOTAL_BYTES`."""
    total = [0]

    def load(p: str) -> str | None:
        try:   # "-" would be standard input to read_bounded: it is a file named "-" here
            data = read_bounded(p if p != "-" else "./-", limit=MAX_LAUNCHER_BYTES, what="the sourced file")
        except InputError as exc:
            if not os.path.lexists(p):
                return None
            raise LauncherError(str(exc)) from None
        total[0] += len(data)
        if total[0] > MAX_TOTAL_BYTES:
            raise LauncherError(f"the launcher and its sourced files exceed {MAX_TOTAL_BYTES} bytes")
        return text_file(data, p)

    return load


def files_loader(named: Mapping[str, str | bytes]) -> Loader:
    """Sourced files among pasted / uploaded ones: by path, else by base name when that is unique."""

    def load(p: str) -> str | None:
        key = posixpath.normpath(p)
        if key not in named:
            same = [k for k in named if posixpath.basename(k) == posixpath.basename(key)]
            if len(same) != 1:
                return None
            key = same[0]
        return text_file(named[key], key)

    return load
