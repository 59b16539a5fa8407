"""The Engine protocol and its registry (issue 16 item 1): every engine answers the same questions,
its vocabulary is consistent with the plan table, and nothing outside ``app/core/engines/``
branches on an engine's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.core.engines import ENGINES, cli_aliases, engine_for, flag_vocabulary, role_rules
from app.core.engines.base import Engine
from app.core.model.config import load_preset
from app.core.plan import ENGINES as PLAN_ENGINES
from app.core.plan import TABLE, Plan
from app.core.verdict import KINDS

REPO = Path(__file__).resolve().parents[3]
NAMES = tuple(ENGINES)


def test_the_registry_is_the_plan_tables_engine_list():
    assert NAMES == PLAN_ENGINES
    assert all(isinstance(e, Engine) and e.name == n for n, e in ENGINES.items())


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_speaks_only_plan_fields(name):
    e = engine_for(name)
    assert e.fields <= set(TABLE), sorted(e.fields - set(TABLE))
    assert {"model", "engine"} <= e.fields
    assert e.acceptance_kind in KINDS
    assert e.workflow in ("training", "serving")
    for flag, field in e.flags.items():   # its own flags name fields it reads
        assert field in e.fields, (flag, field)
    assert e.layout_field(Plan(engine=name)) in e.fields
    assert e.layout_field(Plan(engine=name, mode="split", split=(78,))) in e.fields


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_checks_its_default_plan_and_gives_the_protocols_members(name):
    cfg = load_preset("glm-5.2")
    e = engine_for(name)
    check = e.check(cfg, Plan(engine=name))
    for member in ("roles", "plan", "boundary", "errors", "warnings", "share", "valid", "blocking_violations"):
        getattr(check, member)
    assert isinstance(check.to_json(), dict) and check.text_lines()
    assert check.share.blocking in (True, False) and check.share.message


def test_a_setting_another_engine_reads_is_named_not_silently_used():
    plan = Plan(engine="vllm", cp=2, recompute="full")
    assert set(engine_for("vllm").ignored(plan)) == {"cp", "recompute"}
    assert engine_for("megatron").ignored(Plan(engine="megatron", concurrency=4)) == ["concurrency"]


def test_engine_flags_reach_the_cli_and_the_launcher_vocabulary():
    aliases = cli_aliases()
    assert "--tensor-model-parallel-size" in aliases["tp"] and "--max-tokens-per-gpu" in aliases["tokens_per_gpu"]
    assert "--tp-size" in aliases["tp"]   # SGLang's spelling
    vocab = flag_vocabulary()
    assert vocab["--decoder-first-pipeline-num-layers"] == "first" and "--tp-size" not in vocab   # training only


def test_role_rules_are_one_per_distinct_reading():
    names = [r.engine for r in role_rules()]
    assert names == ["megatron", "slime", "hf"]   # vLLM and SGLang read the config as transformers does


# ----------------------------------------------------------------------------- no branch on a name
_BRANCH = re.compile(r"""(={2,3}|!={1,2}|\bin|\bis)\s*[\(\[]?\s*["'](megatron|slime|hf|vllm|sglang|maxtext)["']""")


def _outside_engines() -> list[Path]:
    """The Python outside ``app/core/engines/``, the page's templates and our own JavaScript."""
    python = [p for p in (REPO / "app").rglob("*.py") if "engines" not in p.relative_to(REPO / "app").parts]
    page = sorted((REPO / "templates").rglob("*.html")) + sorted(p for p in (REPO / "static").glob("*.js"))
    return python + page


def test_nothing_outside_engines_branches_on_an_engines_name():
    hits = []
    paths = _outside_engines()
    assert any(p.suffix == ".html" for p in paths) and any(p.suffix == ".js" for p in paths)
    for path in paths:
        for k, line in enumerate(path.read_text().splitlines(), start=1):
            if _BRANCH.search(line.split("#")[0] if path.suffix == ".py" else line):
                hits.append(f"{path.relative_to(REPO)}:{k}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_the_scan_would_see_a_branch():
    assert _BRANCH.search('if plan.engine == "vllm":') and _BRANCH.search("x in ('sglang', 'vllm')")
    assert _BRANCH.search("{% if v.plan.engine in ['vllm', 'sglang'] %}") and _BRANCH.search("if (e === 'maxtext')")
    assert not _BRANCH.search('ENGINES = ("megatron", "slime")') and not _BRANCH.search('engine="maxtext"')
