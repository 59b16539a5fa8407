"""What one launcher import can cost, known before it runs: the web layer's budget check
(``app.web.deps.launcher_cost``) uses :func:`import_work_estimate`, and a property test holds it
to be an upper bound of the work the reader really charges (:attr:`LauncherParse.work`).

Why it is a bound: the reader's budget is :data:`~app.core.launcher.state.BUDGET_PER_CHAR` units
per character of the launcher and of the files it may source (fixed up front for pasted files),
plus :data:`~app.core.launcher.state.BUDGET_BASE`; every step is charged before it is done and
refused when the budget cannot pay (:meth:`ShellState.spend`), except the join of an expanded
word, counted after (at most :data:`MAX_VALUE` characters for each of at most :data:`MAX_DEPTH`
nested expansions in flight). A Kubernetes ``sh -c`` script is read once more (one line of at
most :data:`~app.core.launcher.kubernetes.MAX_LINE` characters). The plan that results is
evaluated once (linear in layers and stages, bounded by :mod:`app.core.plan.bounds`).
"""

from __future__ import annotations

from app.core.launcher.kubernetes import MAX_LINE
from app.core.launcher.state import BUDGET_BASE, BUDGET_PER_CHAR
from app.core.launcher.text import MAX_DEPTH, MAX_VALUE
from app.core.plan import bounds

#: the most one read can charge beyond its budget (joins of words already expanded)
OVERSHOOT = MAX_DEPTH * MAX_VALUE


def read_work_bound(script_chars: int, sourced_chars: int = 0) -> int:
    """The most work units one read of a launcher of ``script_chars`` characters, with pasted
    files of ``sourced_chars`` characters in all, can charge."""
    return BUDGET_PER_CHAR * (script_chars + sourced_chars) + BUDGET_BASE + OVERSHOOT


def import_work_estimate(script_chars: int, sourced_chars: int, num_layers: int) -> int:
    """An upper bound of the work of :func:`app.core.launcher.import_launcher` on pasted text."""
    sh_c = read_work_bound(MAX_LINE)
    return read_work_bound(script_chars, sourced_chars) + sh_c + 4 * (num_layers + bounds.MAX_PP * bounds.MAX_VPP)
