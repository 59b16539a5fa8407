"""The plan table is the one parser of a plan: URL, CLI and launcher round trips (property tests),
one bound per field, and the adapters generated from it."""

from __future__ import annotations

import argparse
from dataclasses import fields
from urllib.parse import parse_qsl, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.plan import (
    BY_URL,
    TABLE,
    Plan,
    PlanError,
    add_cli_arguments,
    applies,
    encode_query,
    plan_from_cli,
    plan_from_query,
)

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def _value(spec) -> st.SearchStrategy:
    if spec.kind == "int":
        return st.integers(int(spec.lo), int(spec.hi))
    if spec.kind == "float":
        return st.floats(spec.lo, spec.hi, allow_nan=False, allow_infinity=False).map(lambda x: float(f"{x:.15g}"))
    if spec.kind == "bool":
        return st.booleans()
    if spec.kind == "choice":
        return st.sampled_from(spec.choices)
    if spec.kind == "choices":   # distinct choices in any order
        return st.lists(st.sampled_from(spec.choices), min_size=1, max_size=len(spec.choices), unique=True).map(tuple)
    if spec.kind == "sizes":
        return st.lists(st.integers(0, 200), min_size=1, max_size=12).map(tuple)
    alphabet = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
    # a blank text is no value (the URL and the CLI treat "" and " " as unset)
    return st.text(alphabet, min_size=1, max_size=30).filter(str.strip)


@st.composite
def plans(draw, only_applicable: bool = False) -> Plan:
    """Any plan the table allows (values within their bounds); ``only_applicable``: only the
    fields the plan's layout mode uses are set (what a strict CLI accepts)."""
    mode = draw(st.sampled_from(("flags", "split", "layout")))
    values: dict = {"mode": mode}
    for f in fields(Plan):
        spec = TABLE[f.name]
        if f.name in ("mode", "conv") or (only_applicable and not applies(spec, mode)):
            continue
        if f.name == "model":  # a preset id or an uploaded config's id
            values["model"] = draw(st.sampled_from(("glm-5.2", "deepseek-v3.2", "sha256:" + "ab" * 32)))
            continue
        if draw(st.booleans()):
            values[f.name] = draw(_value(spec))
    if mode == "split":
        values["split"] = values.get("split") or draw(_value(TABLE["split"]))
    if mode == "layout":
        values["layout"] = values.get("layout") or "Et*78L"
    pp = max(values.get("pp", 1), len(values["split"]) // (values.get("vpp") or 1)) if mode == "split" else \
        values.get("pp", 1)
    if values.get("tp", 1) * values.get("cp", 1) * pp * (values.get("dp") or 1) > 1 << 20:
        values.pop("cp", None)  # the world is bounded too (TP x PP alone stays within 2^20)
        values.pop("dp", None)
    # a strict conversion slot is --conv-split, or --conv-pp with first/last
    if only_applicable and ("conv_split" in values or "conv_pp" not in values):
        for name in ("conv_pp", "conv_first", "conv_last"):
            values.pop(name, None)
    values["conv"] = "split" if "conv_split" in values else "flags" if "conv_pp" in values else "none"
    return Plan(**values)


@PROPS
@given(plan=plans())
def test_url_round_trip_is_exact(plan):
    """plan -> URL -> plan is the identity, with no problem reported."""
    parsed, problems = plan_from_query(dict(parse_qsl(plan.query(), keep_blank_values=True)))
    assert problems == []
    assert parsed == plan


@PROPS
@given(plan=plans(), extra=st.lists(st.tuples(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",))),
                                               st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)))),
                                     max_size=4))
def test_the_query_encoder_is_urlencode(plan, extra):
    """``encode_query`` (its quoting kept between calls) writes exactly what the standard library's
    ``urlencode`` writes, for a plan's pairs and any text (``&``, ``=``, ``+``, spaces, non-ASCII);
    and ``query_pairs`` is what ``parse_qsl`` reads back from the query (the page's form values)."""
    pairs = plan.query_pairs() + extra
    assert encode_query(pairs) == urlencode(pairs)
    assert encode_query(pairs) == encode_query(pairs)  # the second time from the kept quoting
    assert parse_qsl(plan.query(), keep_blank_values=True) == plan.query_pairs()


def _cli_namespace(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_cli_arguments(parser)
    return parser.parse_args(args)


@PROPS
@given(plan=plans(only_applicable=True))
def test_cli_round_trip_is_exact(plan):
    """plan -> CLI args -> plan -> CLI args: the same args and the same plan."""
    args = plan.cli_args()
    again = plan_from_cli(_cli_namespace(args), args[0])
    assert again == plan
    assert again.cli_args() == args


def test_every_cli_setting_has_a_url_key_and_one_bound():
    urls = [spec.url for spec in TABLE.values()]
    aliases = [a for spec in TABLE.values() for a in spec.aliases]
    assert len(urls) == len(set(urls)) and len(set(urls + aliases)) == len(urls) + len(aliases) == len(BY_URL)
    # one name per setting: the URL key is the field's name and its CLI flag without the dashes
    for name, spec in TABLE.items():
        assert spec.url == name
        if spec.cli:
            assert spec.cli[2:].replace("-", "_") == name, (name, spec.cli)
    clis = [spec.cli for spec in TABLE.values() if spec.cli]
    assert len(clis) == len(set(clis))
    for name, spec in TABLE.items():
        if spec.kind in ("int", "float"):
            assert spec.lo is not None and spec.hi is not None and spec.lo <= spec.hi, name


@pytest.mark.parametrize("query, field, words", [
    ({"split": "100000000"}, "split", "a stage holds 0 to 4,096 layers"),
    ({"pp": "257"}, "pp", "--pp must be between 1 and 256, got 257"),
    ({"vpp": "65"}, "vpp", "--vpp must be between 1 and 64"),
    ({"mtp": "1000000000"}, "mtp_layers", "--mtp-layers must be between 0 and 16"),
    ({"gpus": "1048577"}, "gpus", "--gpus must be between 1 and 1,048,576"),
    ({"split": ",".join(["1"] * 10_001)}, "split", "--split is 20,001 characters; the limit is 20,000"),
    ({"tpg": "1e9"}, "tokens_per_gpu", "must be a whole number"),
])
def test_bounds_are_enforced_before_any_work(query, field, words):
    plan, problems = plan_from_query(query)
    assert [p.field for p in problems][:1] == [field]
    assert words in problems[0].message
    assert plan == Plan(mode=plan.mode)  # the bad value kept the neutral default


def test_strict_cli_names_a_setting_of_another_mode():
    ns = _cli_namespace(["glm-5.2", "--split", "78", "--first", "3"])
    with pytest.raises(PlanError) as exc:
        plan_from_cli(ns, "glm-5.2")
    assert exc.value.field == "first"
    assert "--first does not apply when the layout is given by stage sizes (--split); drop it" in str(exc.value)


def test_the_page_keeps_and_explains_a_setting_of_another_mode():
    from app.core.plan import mode_note

    plan, problems = plan_from_query({"mode": "split", "split": "14,8,8,8,8,8,8,16", "first": "14", "last": "16"})
    assert problems == [] and plan.first == 14  # nothing lost: the URL keeps it
    assert mode_note(plan) == "first, last not used: the layout is given by stage sizes (--split)"


def test_a_stage_list_is_bounded_in_entries_too():
    from app.core.plan import parse_sizes

    with pytest.raises(ValueError, match="has 65,537 entries; the limit is 65,536 stages"):
        parse_sizes([1] * 65_537)


def test_the_world_is_bounded_before_any_work():
    """TP x CP x PP x DP over 2^20 GPUs is refused by the parser (each factor alone is in bounds)."""
    plan, problems = plan_from_query({"tp": "8", "cp": "1024", "dp": "1048576"})
    assert [p.field for p in problems] == ["dp"] and plan.dp is None
    assert "8 x 1024 x 1 x 1048576 = 8,589,934,592 GPUs; the limit is 1,048,576 GPUs" in problems[0].message
    with pytest.raises(PlanError, match="the limit is 1,048,576"):
        plan_from_cli(_cli_namespace(["glm-5.2", "--tp", "8", "--cp", "1024", "--dp", "1048576"]), "glm-5.2")


def test_a_split_is_bounded_in_stages_before_any_work():
    """4,000 stage sizes would be PP 4,000 (issue 9: a 20 kB split cost seconds per request)."""
    plan, problems = plan_from_query({"split": ",".join(["0"] * 3_922 + ["1"] * 78)})
    assert problems[0].field == "split" and "4,000 stages: PP would be over its limit of 256" in problems[0].message
    assert plan.split is None
    ok, none = plan_from_query({"split": ",".join(["1"] * 78 + ["0"] * 50), "vpp": "2"})  # PP 64 x VPP 2
    assert none == [] and len(ok.split or ()) == 128
