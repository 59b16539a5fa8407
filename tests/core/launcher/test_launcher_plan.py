"""Launcher import loses nothing: launcher text -> plan -> URL gives the same check JSON (verdict
included) as ``isplan check --launcher`` on the text (issue 8, property test)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.launcher import import_launcher
from app.core.model.config import load_preset
from app.core.plan import Plan
from tests.verdict.test_twins import run_cli

GLM = load_preset("glm-5.2")
COMPARED = ("valid", "stages", "violations", "errors", "megatron_flags", "layout_string", "verdict", "pp", "vpp")


@st.composite
def launchers(draw) -> str:
    """A Megatron/slime launcher in one of three shapes, with a random flag set (valid or not)."""
    flags: list[tuple[str, str | None]] = [("--tensor-model-parallel-size", str(draw(st.sampled_from([1, 2, 4, 8]))))]
    pp = draw(st.sampled_from([1, 2, 4, 6, 8]))
    flags.append(("--pipeline-model-parallel-size", str(pp)))
    kind = draw(st.sampled_from(["even", "first_last", "layout", "vpp"]))
    if kind == "first_last" and pp > 1:
        flags += [("--decoder-first-pipeline-num-layers", str(draw(st.integers(1, 20)))),
                  ("--decoder-last-pipeline-num-layers", str(draw(st.integers(1, 20))))]
    elif kind == "layout":
        flags.append(("--pipeline-model-parallel-layout", "E" + _layout(pp)))
    elif kind == "vpp" and pp > 1:
        flags.append(("--num-virtual-stages-per-pipeline-rank", str(draw(st.sampled_from([2, 3])))))
    for flag, values in (("--context-parallel-size", [1, 2, 8]), ("--expert-model-parallel-size", [1, 8, 32]),
                         ("--expert-tensor-parallel-size", [1, 2]), ("--mtp-num-layers", [0, 1]),
                         ("--max-tokens-per-gpu", [4096, 8192]), ("--dsa-indexer-topk-freq", [2, 4]),
                         ("--num-layers", [61, 78])):
        if draw(st.booleans()):
            flags.append((flag, str(draw(st.sampled_from(values)))))
    for switch in ("--sequence-parallel", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                   "--no-overlap-p2p-communication", "--account-for-loss-in-pipeline-split"):
        if draw(st.booleans()):
            flags.append((switch, None))
    shape = draw(st.sampled_from(["array", "line", "variables"]))
    words = [w for f, v in flags for w in ((f,) if v is None else (f, f"'{v}'" if "|" in v else v))]
    if shape == "array":
        return "PERF_ARGS=(\n" + "".join(f"   {w}\n" for w in words) + ")\npython3 train.py ${PERF_ARGS[@]}\n"
    if shape == "variables":
        return f"PP={pp}\n" + "torchrun --nproc-per-node 8 pretrain_gpt.py " + " ".join(
            "$PP" if w == str(pp) and i and words[i - 1] == "--pipeline-model-parallel-size" else w
            for i, w in enumerate(words)) + "\n"
    return "python3 train.py " + " \\\n  ".join(words) + "\n"


def _layout(pp: int) -> str:
    """A layout string with ``pp`` stages over GLM-5.2's 78 layers (sizes 78 // pp, rest last)."""
    base = 78 // pp
    sizes = [base] * (pp - 1) + [78 - base * (pp - 1)]
    return "|".join(f"t*{n}" for n in sizes) + "L"




@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=launchers())
def test_launcher_plan_url_gives_the_cli_check(client, tmp_path_factory, text):
    path = tmp_path_factory.mktemp("l") / "run.sh"
    path.write_text(text)
    code, cli = run_cli(["check", "glm-5.2", "--launcher", str(path), "--format", "json"])
    assert "verdict" in cli, cli  # the CLI read the launcher (no exit 2)
    imported = import_launcher(text, GLM, Plan(model="glm-5.2"))
    url = imported.plan.query()
    again = client.get("/api/v1/check?" + url)
    assert again.status_code == 200, again.text
    api = again.json()
    for key in COMPARED:
        assert api[key] == cli[key], (key, url)
    assert code == (0 if cli["verdict"]["go"] else 1)
    # and the URL parses back to the same plan
    from app.core.plan import plan_from_query

    assert plan_from_query(dict(parse_qsl(url)))[0] == imported.plan
