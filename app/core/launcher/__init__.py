"""One bash reader for every launcher, and its two consumers (issue 20, issue 16 items 1, 4, 6).

Nothing is executed: a lexer and an interpreter read a subset of bash statically, rule by rule:

* :mod:`.lexer` - words, operators, ``\\`` continuations, ``#`` comments, quotes, here-documents,
  array bodies (iterative, so 100k-deep nesting is cheap);
* :mod:`.words` - quote removal and expansion of one word; :mod:`.params` - ``$V``, ``${V:-d}``,
  ``${V-d}``, ``${V:=d}``, ``${V:+a}``, ``${V:?}``, ``${A[@]}``, ``${A[i]}``, ``${#V}``, ``${#A[@]}``;
  :mod:`.arith` - ``$(( ... ))`` 64-bit integer arithmetic; :mod:`.printf` - ``printf -v``;
* :mod:`.variables` - scalar assignments, ``export``, ``unset``; :mod:`.arrays` - ``NAME=( ... )``,
  ``+=``, splices; :mod:`.flags` - flags of interest where they are written (:mod:`.vocabulary`:
  the plan table's flags and one documented list of the rest);
* :mod:`.source` - ``source`` / ``.`` through a bounded loader; :mod:`.commands` - the statement
  loop, the trainer invocation (argparse's last occurrence wins) and serving commands' argv.

Consumers: :mod:`.training` (the pipeline spec, model disagreements, GPU count) and
:mod:`.serving` (``vllm serve`` / ``sglang``, with :mod:`.kubernetes` specs); :mod:`.engine` says
which engine a launcher is written for; :mod:`.importer` turns a launcher into a plan and a report;
:mod:`.cost` is the work bound the web layer checks before an import.

Deliberate approximations: every statement is read once, in text order (``if`` / ``case``
branches, loop and function bodies all count); flags are collected where they are *written* (an
array body counts even if it is never expanded); ``VAR=x cmd`` prefix assignments also set VAR for
the rest of the script; command substitution, positional parameters and variables never assigned
in the text are unknown (a flag of interest they feed lands in ``unresolved`` with the reason).
"""

from app.core.launcher.cost import import_work_estimate, read_work_bound
from app.core.launcher.engine import EngineGuess, training_engine
from app.core.launcher.importer import LauncherImport, LauncherImportError, import_launcher, import_serve_launcher
from app.core.launcher.reader import (
    PARALLEL_SIZE_FLAGS,
    candidate_config,
    fail_closed,
    parse_launcher,
    read_launcher,
    read_launcher_files,
)
from app.core.launcher.results import FlagOccurrence, LauncherParse, UnresolvedValue
from app.core.launcher.serving import (
    Provenance,
    ServeLaunch,
    ServeLauncherError,
    parse_serve_launcher,
)
from app.core.launcher.text import MAX_LAUNCHER_BYTES, MAX_SOURCE_DEPTH, MAX_TOTAL_BYTES, LauncherError, where
from app.core.launcher.training import (
    MODEL_FLAGS,
    PIPELINE_FLAGS,
    LauncherRequest,
    launcher_gpus,
    launcher_request,
    model_disagreements,
)
from app.core.launcher.vocabulary import READER_ONLY_FLAGS, switch_flags, value_flags

#: every flag the reader reads a value for / records as a switch (from the plan table + READER_ONLY_FLAGS)
KNOWN_VALUE_FLAGS = value_flags()
KNOWN_SWITCH_FLAGS = switch_flags()

__all__ = [
    "KNOWN_SWITCH_FLAGS", "KNOWN_VALUE_FLAGS", "MAX_LAUNCHER_BYTES", "MAX_SOURCE_DEPTH", "MAX_TOTAL_BYTES",
    "MODEL_FLAGS", "PARALLEL_SIZE_FLAGS", "PIPELINE_FLAGS", "READER_ONLY_FLAGS", "EngineGuess", "FlagOccurrence",
    "LauncherError", "LauncherImport", "LauncherImportError", "LauncherParse", "LauncherRequest", "Provenance",
    "ServeLaunch", "ServeLauncherError", "UnresolvedValue", "candidate_config", "fail_closed", "import_launcher",
    "import_serve_launcher", "import_work_estimate", "launcher_gpus", "launcher_request", "model_disagreements",
    "parse_launcher", "parse_serve_launcher", "read_launcher", "read_launcher_files", "read_work_bound",
    "training_engine", "where",
]
