"""The launcher import's cost estimate is an upper bound of the work it does (issue 20, finding 5-6:
the web layer checks :func:`app.core.launcher.import_work_estimate` before it runs an import).

Hypothesis draws hostile scripts (amplifying splices, ``printf -v``, ``+=``, nesting, sourced
files re-read in a loop, Kubernetes specs) and checks the work the import charged against the
estimate computed from the input sizes alone; a second property checks the charge against the
wall clock, so the units cannot drift from real work unnoticed."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.launcher import (
    LauncherImportError,
    import_launcher,
    import_work_estimate,
    parse_launcher,
    read_launcher_files,
    read_work_bound,
)
from app.core.model.config import load_preset
from app.core.plan import Plan

GLM = load_preset("glm-5.2")
PIECES = [
    "A=(--num-layers 78 --tensor-model-parallel-size 4)\n", 'S="--pipeline-model-parallel-size 8 "\n',
    'S+="$S$S"\n', 'A+=("${A[@]}" "${A[@]}")\n', "B=(${A[@]} $S)\n", 'printf -v P "%s-%d," a 1 b 2 "$S"\n',
    "X=$(( (1 + 2) * 3 % 4 ))\n", "Y=${X:-${S:+$S}}\n", "source ./lib.sh\n", ". lib.sh\n",
    "python3 train.py $S $S ${A[@]} ${B[@]} --mtp-num-layers 1\n", "torchrun pretrain_gpt.py \"${A[@]}\" $S\n",
    "export VLLM_PP_LAYER_PARTITION=38,40\n", "vllm serve m -tp 8 -pp 2\n", "cat <<EOF\n$S\nEOF\n",
    "env:\n  - name: X\n    value: \"1\"\n", "$((", "${", "'", '"', "\\\n", "#", "|", ";", "(", ")",
]
SCRIPTS = st.lists(st.sampled_from(PIECES), min_size=1, max_size=80).map("".join)
LIB = st.lists(st.sampled_from(PIECES[:8] + ["source ./lib.sh\n"]), max_size=20).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(script=SCRIPTS, lib=LIB, repeat=st.integers(1, 40))
def test_the_estimate_bounds_the_work_of_every_import(script, lib, repeat):
    script = script * repeat
    files = {"lib.sh": lib} if lib else None
    sourced = len(lib) if lib else 0
    try:
        imported = import_launcher(script, GLM, Plan(model="glm-5.2"), files=files)
    except LauncherImportError:
        work = _work_of_refused(script, files)
    else:
        work = imported.work
    assert work <= import_work_estimate(len(script), sourced, GLM.num_hidden_layers)


def _work_of_refused(script: str, files: dict[str, str] | None) -> int:
    """A refused import raises, so read the same input again the way it does, for its work."""
    if files:
        return read_launcher_files({"launcher.sh": script, **files}, "launcher.sh", strict=False).work
    return parse_launcher(script).work


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(script=SCRIPTS, repeat=st.integers(50, 400))
def test_work_units_track_the_wall_clock(script, repeat):
    """One unit must stay well under a microsecond of this machine's time (the web budget counts
    about a microsecond per unit): a read far slower than its units would escape the budget."""
    text = script * repeat
    t0 = time.process_time()
    parsed = parse_launcher(text[: 1 << 20])
    seconds = time.process_time() - t0
    assert seconds < 0.05 + 2e-6 * (parsed.work + 8 * len(text)), (seconds, parsed.work)


def test_the_bound_is_what_the_web_layer_checks():
    from app.web.deps import launcher_cost

    script = "python3 train.py --num-layers 78\n" * 100
    assert launcher_cost(script, GLM, 500).estimate == import_work_estimate(len(script), 500, GLM.num_hidden_layers)
    assert read_work_bound(len(script), 500) < import_work_estimate(len(script), 500, GLM.num_hidden_layers)


def test_a_megabyte_launcher_stays_within_the_default_web_budget():
    from app.web.workers import DEFAULT_BUDGET

    assert import_work_estimate(1 << 20, 0, GLM.num_hidden_layers) < DEFAULT_BUDGET
