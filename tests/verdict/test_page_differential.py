"""The page, its JSON twin, ``/api/v1/check`` and the page's CLI line agree (issue 16's differential
test): for plans generated across engines, layout modes, models and parallel settings, the page's
headline, ``/api/v1/plan`` (the page twin), ``/api/v1/check`` and the ``isplan check`` line the page
prints - run as a process, as a launch script runs it - give the same go and the same blocking
kinds, and refuse the same unusable input (422 / exit 2).

Nothing here computes a verdict: each answer comes from a different entry point of the app, and the
test only compares them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from html import unescape
from urllib.parse import parse_qsl, urlencode

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from app.core.engines.slime import SLIME_GLM52_PROFILE
from tests.conftest import REPO

MODELS = ("glm-5.2", "deepseek-v3", "llama-3.1-70b", "qwen3-235b-a22b")
LAYERS = {"glm-5.2": 78, "deepseek-v3": 61, "llama-3.1-70b": 80, "qwen3-235b-a22b": 94}




@st.composite
def plans(draw) -> dict[str, str]:
    model = draw(st.sampled_from(MODELS))
    engine = draw(st.sampled_from(("megatron", "slime", "hf", "vllm", "sglang", "maxtext")))
    q: dict[str, str] = {"model": model, "engine": engine}
    n = LAYERS[model]
    if engine == "maxtext":
        q["ici_pipeline_parallelism"] = str(draw(st.sampled_from((1, 2, 4))))
        q["layers_per_pipeline_stage"] = str(draw(st.sampled_from((1, 2, 3, 4, 5))))
        return q
    pp = draw(st.sampled_from((1, 2, 4, 8)))
    mode = draw(st.sampled_from(("flags", "split")))
    if mode == "split":  # near-even sizes, sometimes moved by a few layers (valid or not), sometimes short
        sizes = [n // pp + (1 if i < n % pp else 0) for i in range(pp)]
        if pp > 1 and draw(st.booleans()):
            k, d = draw(st.integers(0, pp - 2)), draw(st.integers(-3, 3))
            sizes[k] += d
            sizes[k + 1] -= d
        if draw(st.integers(0, 9)) == 0:
            sizes[-1] -= 1  # does not sum to the layers: refused by the engine
        q["split"] = ",".join(map(str, sizes))
    else:
        q["pp"] = str(pp)
        if engine not in ("vllm", "sglang") and pp > 1 and draw(st.booleans()):
            q["first"] = str(draw(st.integers(1, n // pp + 3)))
    if draw(st.booleans()):  # the plan states its parallelism: memory, GPUs and constraints are judged
        q["tp"] = str(draw(st.sampled_from((1, 2, 4, 8))))
        if draw(st.booleans()):
            q["ep"] = str(draw(st.sampled_from((1, 8, 16))))
        if engine not in ("vllm", "sglang"):
            if draw(st.booleans()):
                q["dp"] = str(draw(st.sampled_from((1, 2, 4))))
            if draw(st.booleans()):
                q["recompute"] = "full"
    return q


def _cli(line: str) -> tuple[int, dict | None]:
    args = shlex.split(line)
    assert args[:2] == ["isplan", "check"], line
    run = subprocess.run([sys.executable, "-m", "app", "check", *args[2:], "--format", "json"], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert run.returncode in (0, 1, 2), run.stderr[-2000:]
    return run.returncode, json.loads(run.stdout) if run.returncode in (0, 1) else None


def _kinds(verdict: dict) -> list[str]:
    return sorted({r["kind"] for r in verdict["blocking"]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=plans())
@example(q=dict(parse_qsl(SLIME_GLM52_PROFILE.query())))  # a judged plan that runs (slime's launcher)
@example(q={"model": "glm-5.2", "engine": "vllm", "split": "18,20,20,20", "tp": "8", "context": "32768"})
@example(q={"model": "glm-5.2", "engine": "sglang", "pp": "8", "tp": "8"})  # shared starts handed over
@example(q={"model": "glm-5.2", "engine": "vllm", "first": "14"})  # a setting vLLM does not read: 422
def test_page_api_and_cli_line_agree(client, q):
    query = urlencode(q)
    twin = client.get("/api/v1/plan?" + query)
    check = client.get("/api/v1/check?" + query)
    assert twin.status_code in (200, 422) and check.status_code == twin.status_code, (q, twin.text[:300], check.text[:300])
    html = unescape(client.get("/?" + query).text)
    headline = re.search(r'<h2 id="verdict" class="verdict"><strong>(GO|NO-GO)</strong>', html).group(1)
    if twin.status_code == 422:  # the CLI line is made for usable plans only; the page explains the field
        event("refused (422)")
        return
    page, body = twin.json(), check.json()
    assert page["verdict"]["go"] == body["verdict"]["go"], (q, page["verdict"], body["verdict"])
    assert _kinds(page["verdict"]) == _kinds(body["verdict"]), q
    assert headline == ("GO" if page["verdict"]["go"] else "NO-GO"), q
    event(f"judged {sorted(page['verdict']['judged'])}, go {page['verdict']['go']}")
    code, cli = _cli(page["exports"]["cli"])
    assert cli is not None, (q, page["exports"]["cli"])
    assert code == (0 if page["verdict"]["go"] else 1), (q, page["exports"]["cli"], cli["verdict"])
    assert cli["verdict"]["go"] == page["verdict"]["go"] and _kinds(cli["verdict"]) == _kinds(page["verdict"]), q
