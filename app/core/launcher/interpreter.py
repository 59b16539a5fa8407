"""The interpreter: the rule mixins put together, and the :class:`LauncherParse` of one read."""

from __future__ import annotations

from app.core.launcher.arith import ArithRules
from app.core.launcher.arrays import ArrayRules
from app.core.launcher.commands import CommandRules
from app.core.launcher.flags import FlagRules
from app.core.launcher.params import ParamRules
from app.core.launcher.printf import PrintfRules
from app.core.launcher.results import FlagOccurrence, LauncherParse, duplicate_warning
from app.core.launcher.source import SourceRules
from app.core.launcher.text import TOO_COMPLEX
from app.core.launcher.variables import VariableRules
from app.core.launcher.vocabulary import switch_flags, value_flags
from app.core.launcher.words import WordRules

MAX_NOTES = 20


class Interpreter(CommandRules, SourceRules, PrintfRules, ArrayRules, VariableRules, FlagRules, ParamRules,
                  WordRules, ArithRules):
    """Walks the tokens once, in text order, tracking variables and recording flag occurrences."""

    def result(self) -> LauncherParse:
        """Final values: every occurrence in text order, except that the trainer command line's flags
        come last and in that line's expanded order (argparse: the last occurrence wins)."""
        source = self.final_flags()
        values: dict[str, str] = {}
        by_flag: dict[str, list[FlagOccurrence]] = {}
        known_values, known_switches = value_flags(), switch_flags()
        for occ in source:
            if occ.flag in known_values:
                by_flag.setdefault(occ.flag, []).append(occ)
                if occ.value is None:
                    values.pop(occ.flag, None)
                else:
                    values[occ.flag] = occ.value
        warnings = [duplicate_warning(flag, occs) for flag, occs in by_flag.items()
                    if len({o.value if o.value is not None else f"{o.raw} (unresolved)" for o in occs}) > 1]
        notes = self.notes + [note for name, note in self.unknown.items()
                              if name not in self.arrays and name not in self.scalars]
        more = [f"... and {len(notes) - MAX_NOTES} more"] if len(notes) > MAX_NOTES else []
        return LauncherParse(
            values=values,
            switches=frozenset(o.flag for o in source if o.flag in known_switches),
            occurrences=tuple(self.occurrences),
            unresolved=tuple(self.unresolved),
            warnings=tuple(warnings + notes[:MAX_NOTES] + more),
            variables={k: t for k, (t, r) in self.scalars.items() if r is None},
            final=tuple(self.final or ()),
            trainer_argv=tuple(self.trainer_argv or ()),
            trainer=self.trainer,
            files=tuple(self.files),
            missing=tuple(self.missing),
            fatal=tuple(self.fatal + ([TOO_COMPLEX] if TOO_COMPLEX in self.notes else [])),
            program=self.program,
            arrays=tuple(self.arrays),
            commands=tuple(self.commands),
            environment=dict(self.origins),
            work=self.spent,
            runs=tuple(self.runs),
        )
