"""Commands: the statement loop and what each kind of command does.

Every statement is read once, in text order (``if`` / ``case`` branches, loop and function bodies
all count; ``then``, ``do``, ``{`` ... at the start of a command are skipped). ``|``, ``;``, ``&&``,
``(`` ... only separate commands; redirection targets are skipped. A command is an assignment, a
declaration (``export`` / ``declare`` ...), ``source`` / ``.``, ``printf -v``, ``unset``, or an
invocation: the trainer invocation (a ``*.py`` word or ``torchrun`` / ``python`` / ..., in a command
that runs it - not ``pkill -9 python``, :data:`_BY_NAME`) keeps its
final, ordered flag list - its literal flags plus those of every ``${ARR[@]}`` / ``$VAR`` it
expands, in command-line order (argparse: the last occurrence wins); a command naming vLLM or
SGLang keeps its whole expanded argv and the variables assigned for it (:class:`Command`).
"""

from __future__ import annotations

import posixpath
import re

from app.core.launcher.arrays import SPLICE_RE
from app.core.launcher.engine import COMMAND_WORDS
from app.core.launcher.lexer import NAME, REDIRECTS, Token, lex, opener
from app.core.launcher.results import Arg, Command, EnvValue, FlagOccurrence
from app.core.launcher.state import ShellState
from app.core.launcher.text import SPLICE_COST, TOO_COMPLEX, short, where
from app.core.launcher.variables import ASSIGN_RE
from app.core.launcher.words import NAME_RE

#: A word that makes a command the trainer invocation: a Python entry point or a launcher of one.
TRAINERS = frozenset({"torchrun", "python", "python3", "deepspeed", "accelerate"})
_PRINTERS = frozenset({"echo", "printf", "cat", "logger", ":"})   # commands that only print their words
#: commands that find or signal a program by its name without running it: ``pkill -9 python`` after
#: the run (THUDM/slime ``examples/on_policy_distillation/run-qwen3-8B-opd-megatron.sh`` @ 624b824a ends
#: so) is not a trainer invocation, and must not take the trainer line's place
_BY_NAME = frozenset({"pkill", "pgrep", "killall", "pidof", "kill", "which", "whereis", "type", "hash"})
_DECLARE = frozenset({"export", "readonly", "local", "declare", "typeset"})
_RESERVED = frozenset({"if", "then", "elif", "else", "fi", "while", "until", "do", "done", "esac",
                       "{", "}", "!", "time"})   # skipped at the start of a command
_VAR_WORD_RE = re.compile(rf'"?\$(?:\{{({NAME})(?:\[[@*]\])?\}}|({NAME}))"?')


def is_trainer_word(raw: str) -> bool:
    """A word naming a Python entry point or a launcher of one (not text such as ``"run x.py"``)."""
    word = raw.strip("\"'")
    if not word or any(c.isspace() for c in word):
        return False
    return word.endswith(".py") or word in TRAINERS or posixpath.basename(word) in TRAINERS


class CommandRules(ShellState):
    def run(self) -> None:
        """Read ``self.text`` statement by statement."""
        problems: list[int] = []
        cmd: list[Token] = []
        skip = False
        for tok in lex(self.text, 0, len(self.text), problems):
            kind, val, _ = tok
            if kind == "op" and val in REDIRECTS:
                skip = True
            elif kind in ("op", "nl"):
                if cmd:
                    self.command(cmd)
                cmd, skip = [], False
            elif skip:
                skip = False   # a redirection target
            else:
                cmd.append(tok)
        self.command(cmd)
        if problems:
            pos = min(problems)
            what = f"unterminated {opener(self.text, pos)}"
            self.notes.append(f"line {self.line(pos)}: {what} (a quote, expansion or array never closed); "
                              "the rest of the script was read as part of it")
            self.fatal.append(f"{where(self.file, self.line(pos))}: {what} (a quote, expansion or array "
                              "never closed)")

    def command(self, items: list[Token]) -> None:
        i = 0
        while i < len(items) and items[i][0] == "word" and items[i][1] in _RESERVED:
            i += 1
        start = i
        while i < len(items) and self.assign(items[i]):
            i += 1
        prefix, rest = items[start:i], items[i:]
        head = rest[0][1] if rest and rest[0][0] == "word" else None
        if not rest:
            for item in prefix:
                self.record_origin(item, "assignment")
        elif head in _DECLARE:
            self.declare(str(head), rest[1:])
        elif head in ("source", ".") and len(rest) == 1:
            self.missing.append(f"{head} without a readable file name at {where(self.file, self.line(rest[0][2]))} "
                                "(a process substitution or redirection cannot be read)")
        elif head in ("source", ".") and len(rest) > 1:
            if not self.source(rest[1], rest[0][2]):
                self.notes.append(f"{where(self.file, self.line(rest[0][2]))}: {head} {short(str(rest[1][1]), 40)} "
                                  "is not read; anything it defines is unknown here")
        elif head == "printf" and len(rest) > 3 and rest[1][1] == "-v" and NAME_RE.fullmatch(str(rest[2][1])):
            self.printf_v(str(rest[2][1]), [str(raw) for kind, raw, _ in rest[3:] if kind == "word"])
        elif head == "unset":
            self.unset(rest[1:])
        else:
            for item in rest:
                if item[0] == "array":
                    self.assign(item)
            self.invocation(rest, prefix)

    def declare(self, head: str, items: list[Token]) -> None:
        """``export`` / ``readonly`` / ``local`` / ``declare`` / ``typeset`` with assignments or names;
        ``export`` and ``declare -x`` / ``typeset -x`` put the variables into the environment."""
        for item in items:
            self.assign(item)
        options = "".join(str(raw)[1:] for kind, raw, _ in items if kind == "word" and str(raw).startswith("-"))
        how = "export" if head == "export" or (head in ("declare", "typeset") and "x" in options) else "assignment"
        for item in items:
            self.record_origin(item, how)
        if how == "export":
            self.export(items)

    def invocation(self, rest: list[Token], prefix: list[Token]) -> None:
        """Scan a command's flags; keep the trainer's final flag list and a serving command's argv."""
        words = [(str(raw), pos) for kind, raw, pos in rest if kind == "word"]
        start = len(self.occurrences)
        self.scan(words)
        placed = list(zip(self.occ_pos[start:], self.occurrences[start:]))
        for raw, pos in words:
            m = _VAR_WORD_RE.fullmatch(raw)
            if m:   # the flags written in that variable, charged per spliced occurrence (finding 6)
                occs = self.var_occ.get(m.group(1) or m.group(2), [])
                if not self.spend(SPLICE_COST * len(occs)):
                    break
                placed += [(pos, o) for o in occs]
        head = posixpath.basename(words[0][0].strip("\"'")) if words else ""
        if words and head not in _PRINTERS | _BY_NAME and any(is_trainer_word(raw) for raw, _ in words):
            self.trainer = (self.file, self.line(words[0][1]))
            self.final = [o for _, o in sorted(placed, key=lambda t: t[0])]
            # the whole argv (unknown flags too), unless the reading is already over its budget:
            # such a script fails closed, and expanding it again would only spend time
            self.trainer_argv = self.argv(words) if TOO_COMPLEX not in self.notes else []
            self.program = next((raw.strip("\"'") for raw, _ in words if raw.strip("\"'").endswith(".py")), None)
            self.runs.append((*self.trainer, self.program, frozenset((o.flag, o.value) for o in self.final)))
        if words and self.names_a_launch(words):
            env = {}
            for item in prefix:
                m = ASSIGN_RE.match(str(item[1])) if item[0] == "word" else None
                if m and m.group(1) in self.scalars:
                    text, reason = self.scalars[m.group(1)]
                    env[m.group(1)] = EnvValue(text, reason, self.file, self.line(item[2]), "prefix")
            self.commands.append(Command(tuple(self.argv(words)), env, self.file, self.line(words[0][1])))

    def names_a_launch(self, words: list[tuple[str, int]]) -> bool:
        """Whether a word of the command names an engine launched as a command (``COMMAND_WORDS``),
        as written or through a variable that is the whole word (``TRAIN_CMD="python3 -m ...";
        $TRAIN_CMD``); each variable's text is searched once, however often it is spliced."""
        seen: set[str] = set()
        for raw, _ in words:
            if any(name in raw for name in COMMAND_WORDS):
                return True
            m = _VAR_WORD_RE.fullmatch(raw) if "$" in raw else None
            var = (m.group(1) or m.group(2)) if m else None
            if var is None or var in seen:
                continue
            seen.add(var)
            text = self.scalars.get(var, ("", None))[0]
            known = self.launch_texts.get(var)
            if known is None or known[0] is not text:
                known = self.launch_texts[var] = (text, any(name in text for name in COMMAND_WORDS))
            if known[1]:
                return True
        return False

    def argv(self, words: list[tuple[str, int]]) -> list[Arg]:
        """The command's argv as bash would pass it: ``"${A[@]}"`` gives A's elements, an unquoted
        ``$V`` / ``${A[@]}`` is split on blanks; every other word is one argument."""
        out: list[Arg] = []
        for raw, pos in words:
            line = self.line(pos)
            splice = SPLICE_RE.fullmatch(raw)
            if splice and splice.group(1) in self.arrays:
                elems = self.arrays[splice.group(1)]
                if not self.spend(8 * len(elems)):
                    out.append(Arg("", TOO_COMPLEX, raw, self.file, line))
                    continue
                for text, reason in elems:
                    parts = [text] if raw.startswith('"') or reason else text.split()
                    out += [Arg(p, reason, raw, self.file, line) for p in parts]
                continue
            text, reason = self.expand(raw)
            if _VAR_WORD_RE.fullmatch(raw) and not raw.startswith('"') and reason is None:
                out += [Arg(p, None, raw, self.file, line) for p in text.split()]
            else:
                out.append(Arg(text, reason, raw, self.file, line))
        return out

    def final_flags(self) -> list[FlagOccurrence]:
        """Every occurrence in text order, the trainer line's flags last in that line's order."""
        if self.final is None:
            return self.occurrences
        passed = {id(o) for o in self.final}
        return [o for o in self.occurrences if id(o) not in passed] + self.final
