"""``printf -v NAME FORMAT ARGS...`` with ``%s``, ``%d`` and ``%%``: the format is reused while
arguments remain, as bash does. Linear in the arguments and charged per argument (issue 20
finding 5: 40,000 arguments took > 20 s when each pass popped the head of a list and re-summed
the output); anything else leaves NAME unresolved."""

from __future__ import annotations

from app.core.launcher.results import INT_RE
from app.core.launcher.state import ShellState
from app.core.launcher.text import MAX_VALUE, TOO_COMPLEX, TOO_LONG


def format_printf(fmt: str, args: list[str]) -> str:
    """bash's ``printf FORMAT ARGS`` for ``%s`` / ``%d`` / ``%%`` (ValueError for anything else)."""
    out: list[str] = []
    size, k = 0, 0
    consumes = "%" in fmt.replace("%%", "")
    while True:
        i = 0
        while i < len(fmt):
            c = fmt[i]
            if c != "%":
                out.append(c)
                size += 1
                i += 1
                continue
            spec = fmt[i + 1:i + 2]
            if spec == "%":
                piece = "%"
            elif spec == "s":
                piece = args[k] if k < len(args) else ""
                k += 1
            elif spec == "d":
                arg = args[k] if k < len(args) else "0"
                k += 1
                if not INT_RE.fullmatch(arg.strip()):
                    raise ValueError(f"{arg!r} is not an integer for %d")
                piece = str(int(arg))
            else:
                raise ValueError(f"unsupported format %{spec}")
            out.append(piece)
            size += len(piece)
            if size > MAX_VALUE:
                raise ValueError(TOO_LONG)
            i += 2
        if k >= len(args) or not consumes:
            break
    return "".join(out)


class PrintfRules(ShellState):
    def printf_v(self, name: str, words: list[str]) -> None:
        """Set NAME to what ``printf -v NAME FORMAT ARGS...`` prints (unresolved if any part is)."""
        if not self.spend(8 * len(words)):
            self.set_scalar(name, ("", TOO_COMPLEX))
            self.var_occ[name] = []
            return
        fmt, reason = self.expand(words[0])
        args: list[str] = []
        for w in words[1:]:
            text, r = self.expand(w)
            reason = reason or r
            if reason:
                break
            args.append(text)
        if reason is None:
            try:
                text = format_printf(fmt, args)
            except ValueError as exc:
                text, reason = "", f"printf -v {name}: {exc}"
        self.set_scalar(name, ("", reason) if reason else (text, None))
        self.var_occ[name] = []
