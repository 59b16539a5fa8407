"""The reader's state: variables, arrays, flag occurrences, the work budget, and the stubs through
which one rule module calls another (each rule is a mixin of :class:`~app.core.launcher.interpreter.Interpreter`).

Values are ``(text, reason)`` pairs: ``reason`` is None when the text is known, else why it is not.
Work is charged with :meth:`ShellState.spend` *before* it is done, so the total work of one read is
at most the budget plus one step (see :mod:`app.core.launcher.cost`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from app.core.launcher.lexer import Token
from app.core.launcher.results import Arg, Command, EnvValue, FlagOccurrence, UnresolvedValue
from app.core.launcher.text import TOO_COMPLEX, line_starts

Value = tuple[str, "str | None"]
#: a resolved path -> its text, or None when it does not exist (raises LauncherError when it must not be read)
Loader = Callable[[str], "str | None"]

#: budget units per character of every file read, and the fixed allowance of one read
BUDGET_PER_CHAR = 8
BUDGET_BASE = 100_000


class ShellState:
    """Everything one read of a launcher (and the files it sources) accumulates."""

    def __init__(self, text: str, file: str = "", loader: Loader | None = None, sourced_budget: int | None = None) -> None:
        self.text = text
        self.file = file
        self.loader = loader
        self.depth = 0
        self.sourced = len(text)   # characters read, sourced files counted each time they are read
        self.files = [file]
        self.missing: list[str] = []
        self.fatal: list[str] = []
        self.trainer: tuple[str, int] | None = None
        #: every trainer invocation read: (file, line, entry point as written, the flags on its line
        #: with their values)
        self.runs: list[tuple[str, int, str | None, frozenset[tuple[str, str | None]]]] = []
        self.program: str | None = None
        self.final: list[FlagOccurrence] | None = None
        self.trainer_argv: list[Arg] | None = None   # the trainer command's argv, as bash passes it
        self.var_occ: dict[str, list[FlagOccurrence]] = {}   # flags written in each variable, in order
        self.occ_pos: list[int] = []   # text position of each occurrence (same index)
        self.line_starts = line_starts(text)
        self.scalars: dict[str, Value] = {}
        self.arrays: dict[str, list[Value]] = {}
        self.origins: dict[str, EnvValue] = {}   # where each scalar was last set, and whether exported
        self.exported: set[str] = set()
        self.commands: list[Command] = []
        #: variable -> (its text when searched, whether it names a launch): each text searched once
        self.launch_texts: dict[str, tuple[str, bool]] = {}
        self.occurrences: list[FlagOccurrence] = []
        self.unresolved: list[UnresolvedValue] = []
        self.notes: list[str] = []
        self.unknown: dict[str, str] = {}   # array name -> note, for arrays expanded before assigned
        # with ``sourced_budget`` (the characters of every file that may be sourced, known up front:
        # pasted files) the budget is fixed; otherwise each file read adds its own share
        self.grows = sourced_budget is None
        self.budget = BUDGET_PER_CHAR * (len(text) + (sourced_budget or 0)) + BUDGET_BASE
        self.spent = 0

    def line(self, pos: int) -> int:
        return bisect.bisect_right(self.line_starts, pos)

    def spend(self, n: int) -> bool:
        """Charge ``n`` work units before doing that work; False (and a note) when the budget
        cannot pay for it: the caller then skips the work, so it is not counted."""
        if n > self.budget:
            self.budget = -1
            if TOO_COMPLEX not in self.notes:
                self.notes.append(TOO_COMPLEX)
            return False
        self.budget -= n
        self.spent += n
        return True

    def charge(self, n: int) -> None:
        """Count ``n`` units of work already done (the join of one expanded word, at most
        :data:`~app.core.launcher.text.MAX_VALUE` characters)."""
        self.spent += n
        self.budget -= n

    # --- the rules, implemented by the mixins (declared here so each module can call the others)
    def run(self) -> None:
        raise NotImplementedError

    def expand(self, raw: str, depth: int = 0) -> Value:
        raise NotImplementedError

    def lookup(self, name: str, index: str | None = None, depth: int = 0) -> tuple[str, str | None, bool]:
        raise NotImplementedError

    def param(self, body: str, depth: int) -> Value:
        raise NotImplementedError

    def arith(self, expr: str, depth: int) -> int:
        raise NotImplementedError

    def assign(self, item: Token) -> bool:
        raise NotImplementedError

    def set_scalar(self, name: str, value: Value) -> None:
        raise NotImplementedError

    def assign_array(self, item: Token) -> None:
        raise NotImplementedError

    def record_origin(self, item: Token, how: str) -> None:
        raise NotImplementedError

    def export(self, items: list[Token]) -> None:
        raise NotImplementedError

    def unset(self, items: list[Token]) -> None:
        raise NotImplementedError

    def scan(self, words: list[tuple[str, int]], exps: list[Value | None] | None = None) -> None:
        raise NotImplementedError

    def source(self, item: Token, pos: int) -> bool:
        raise NotImplementedError

    def printf_v(self, name: str, words: list[str]) -> None:
        raise NotImplementedError

