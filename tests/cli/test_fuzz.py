"""Hypothesis fuzzing of every parser and of the CLI.

Each property feeds one entry point random and adversarial input and asserts the contract in its
docstring: it returns, or raises only its documented error type with a non-empty message, and it
returns quickly (a SIGALRM guard turns a hang into a failure instead of a stuck run). Anything
else - a TypeError, an AttributeError, a UnicodeEncodeError, a plain ValueError, a hang - is a bug.

Example counts are moderate (~200-300 per property) so the file stays under about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import re
import signal
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from app.core.engines.megatron.check import run_check
from app.core.engines.megatron.placement import materialise
from app.core.launcher import (
    KNOWN_SWITCH_FLAGS,
    KNOWN_VALUE_FLAGS,
    LauncherError,
    LauncherParse,
    launcher_request,
    parse_launcher,
)
from app.core.layout.pipeline_layout import MAX_EXPANDED, LayoutSyntaxError, parse_layout
from app.core.layout.stages import LayoutInputError, PipelineSpec, StagePlan
from app.core.model.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    ModelConfig,
    load_config_bytes,
    load_preset,
    preset_ids,
)
from app.core.model.roles import PatternError
from app.core.plan import BY_URL, TABLE, Plan, parse_sizes, plan_from_query
from app.core.plan.bounds import MAX_GPUS, MAX_LAYERS
from app.core.receipt import (
    ReceiptError,
    build_receipt,
    canonical_body_digest,
    verify_receipt,
)
from app.web.store import ConfigStore
from app.web.view import PlanView, build_view
from tests.conftest import REPO, tiny_config

GLM = load_preset("glm-5.2")
PRESET_FILE = REPO / "app" / "core" / "presets" / "glm-5.2.json"

# --------------------------------------------------------------------------- harness

CALL_LIMIT = 5.0  # seconds any single parser call may take on adversarial input (CI has 2 slow cores)

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
FEW = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
# timing properties: no shrinking (every shrink step could cost a full time limit)
TIMING = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck),
                  phases=[Phase.explicit, Phase.reuse, Phase.generate])


class Hang(BaseException):
    """Raised by the SIGALRM guard; a BaseException so no ``except Exception`` in the app eats it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def _alarm(signum, frame):
        raise Hang(f"call did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def call(fn: Callable[..., Any], *args: Any, allowed: tuple[type[BaseException], ...] = (),
         limit: float = CALL_LIMIT, **kwargs: Any) -> tuple[Any, BaseException | None]:
    """Run ``fn``; return (result, None) or (None, exc) for an allowed exception (which must carry a
    message). Any other exception propagates, so hypothesis reports it with the falsifying input;
    a call over ``limit`` seconds fails."""
    with contextlib.suppress(InvalidArgument):  # note() works only inside a hypothesis test
        note(f"{getattr(fn, '__name__', fn)}{_short_repr(args)}")
    t0 = time.perf_counter()
    try:
        with time_limit(limit):
            result = fn(*args, **kwargs)
    except allowed as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"
        return None, exc
    finally:
        elapsed = time.perf_counter() - t0
        with contextlib.suppress(InvalidArgument):  # note() works only inside a hypothesis test
            note(f"{getattr(fn, '__name__', fn)} took {elapsed:.3f} s")
    assert elapsed < limit, f"{fn.__name__} took {elapsed:.2f} s"
    return result, None


def _short_repr(args: tuple, limit: int = 3000) -> str:
    text = repr(args)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


# text that includes lone surrogates (JSON "\ud800" escapes decode to them) and the layout alphabet
CHARS = st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from(list("0123456789,|()*Etml-+ \t\n")))
TEXT = st.text(CHARS, max_size=120)
INTS = st.one_of(st.integers(-3, 300), st.integers(), st.sampled_from([0, 1, 2, 8, 78, 4096, 4097, 65536, 10**9, 10**12, -1]))


# --------------------------------------------------------------------------- stages: parse_sizes / materialise


SPLIT_TEXT = st.one_of(
    TEXT,
    st.text(st.sampled_from(list("0123456789,+- \t٣²")), max_size=60),
    st.lists(st.one_of(st.integers(-5, 40), st.integers(-(10**12), 10**12)), min_size=1, max_size=40).map(
        lambda xs: ",".join(map(str, xs))),
    st.lists(st.integers(0, 20), min_size=1, max_size=12).flatmap(
        lambda xs: st.lists(st.sampled_from(["", " ", "\t", "  "]), min_size=2 * len(xs), max_size=2 * len(xs)).map(
            lambda pads: ",".join(f"{pads[2 * i]}{x}{pads[2 * i + 1]}" for i, x in enumerate(xs)))),
)


@FUZZ
@given(text=SPLIT_TEXT)
@example(text="²")  # found: '²'.isdigit() is True but int('²') raises a plain ValueError
@example(text="14,8,٣")
@example(text="0\x1f")  # found: str.strip() takes the unit separator as white space, int() does not
def test_parse_sizes_raises_only_value_error(text):
    """parse_sizes (what the CLI's --split / --near and the URL's split read with): a tuple of ints
    0..MAX_LAYERS (the entries as written, around white space) or ValueError."""
    result, exc = call(parse_sizes, text, allowed=(ValueError,))
    if exc is None:
        assert isinstance(result, tuple) and result and all(isinstance(v, int) and 0 <= v <= MAX_LAYERS for v in result)
        assert result == tuple(int(p.strip()) for p in text.split(","))


PP = st.one_of(st.none(), st.integers(-2, 20), st.sampled_from([4096, 4097, 10**6]))
VPP = st.one_of(st.none(), st.integers(-2, 8), st.sampled_from([4096, 4097]))
MTP = st.one_of(st.none(), st.integers(-2, 4))
NUM_LAYERS = st.one_of(st.just(78), st.integers(0, 200))


@FUZZ
@given(text=SPLIT_TEXT, pp=PP, vpp=VPP, mtp=MTP, overlap=st.booleans(), num_layers=NUM_LAYERS,
       default_mtp=st.integers(0, 3))
def test_materialise_split_raises_only_layout_input_error(text, pp, vpp, mtp, overlap, num_layers, default_mtp):
    """materialise(split=...) on parsed sizes: a StagePlan (rule violations in .errors) or LayoutInputError."""
    sizes, exc = call(parse_sizes, text, allowed=(ValueError,))
    assume(exc is None)
    spec = PipelineSpec(split=sizes, pp=pp, vpp=vpp, mtp_layers=mtp, overlap_p2p=overlap)
    plan, exc = call(materialise, spec, num_layers, default_mtp=default_mtp, allowed=(LayoutInputError,))
    if exc is None:
        assert isinstance(plan, StagePlan)
        assert plan.sizes == list(sizes)
        assert plan.pp * plan.vpp == len(sizes)
        assert all(e.message for e in plan.errors)
        if not plan.errors:
            assert sum(plan.sizes) == num_layers


# --------------------------------------------------------------------------- pipeline_layout: parse_layout

LAYOUT_ALPHABET = "EtmLl|()*,0123456789"  # tokens E t m L, plus a stray l
TOKEN = st.sampled_from("EtmL" "tttt")  # mostly decoder layers


@st.composite
def structured_layouts(draw) -> tuple[str, list[list[str]] | None, int, int]:
    """A syntactically valid layout string, its expected stages (None when too big to build), the
    length after group expansion and the final length (both as Megatron unrolls it)."""

    def count() -> int:
        return draw(st.one_of(st.integers(0, 6), st.integers(0, 40), st.sampled_from([999_999, 10**6, 10**11, 10**13])))

    def seq(allow_groups: bool) -> str:
        parts = []
        for _ in range(draw(st.integers(1, 6))):
            kind = draw(st.sampled_from(["atom", "atom", "bar", "group"] if allow_groups else ["atom", "atom", "bar"]))
            if kind == "bar":
                parts.append("|")
                continue
            if kind == "atom":
                c = draw(TOKEN)
                parts.append(f"{c}*{count()}" if draw(st.booleans()) else c)
            else:
                parts.append(f"({seq(False)})*{count()}")
            if draw(st.booleans()):
                parts.append(",")  # cosmetic, removed first
        return "".join(parts)

    text = seq(True)
    group_len, final_len = _group_expanded_len(text), _final_len(text)
    expected = None
    if group_len <= 200_000 and final_len <= 200_000:
        expected = [list(s) for s in _unroll(text).split("|")]
    return text, expected, group_len, final_len


_G = re.compile(r"\(([^()]*)\)\*(\d+)")
_S = re.compile(r"([EtmL|])\*(\d+)")


def _group_expanded_len(text: str) -> int:
    text = text.replace(",", "")
    total = len(text)
    for m in _G.finditer(text):
        total += len(m.group(1)) * int(m.group(2)) - len(m.group(0))
    return total


def _final_len(text: str) -> int:
    text = text.replace(",", "")

    def single_len(s: str) -> int:
        total = len(s)
        for m in _S.finditer(s):
            total += int(m.group(2)) - len(m.group(0))
        return total

    total = 0
    pos = 0
    for m in _G.finditer(text):
        total += single_len(text[pos:m.start()]) + single_len(m.group(1)) * int(m.group(2))
        pos = m.end()
    return total + single_len(text[pos:])


def _unroll(text: str) -> str:
    text = text.replace(",", "")
    text = _G.sub(lambda m: m.group(1) * int(m.group(2)), text)
    return _S.sub(lambda m: m.group(1) * int(m.group(2)), text)


LAYOUT_TEXT = st.one_of(
    st.text(st.sampled_from(LAYOUT_ALPHABET), max_size=80),
    st.text(st.sampled_from(LAYOUT_ALPHABET + "Etttt|||"), min_size=1, max_size=300),
    TEXT,
    structured_layouts().map(lambda t: t[0]),
)


def _check_stages(stages: Any) -> None:
    assert isinstance(stages, list) and stages
    assert all(isinstance(s, list) and set(s) <= {"E", "t", "m", "L"} for s in stages)
    assert sum(map(len, stages)) <= MAX_EXPANDED


@FUZZ
@given(text=LAYOUT_TEXT)
def test_parse_layout_raises_only_layout_syntax_error(text):
    """parse_layout: stages of E/t/m/L tokens, or LayoutSyntaxError with a message."""
    stages, exc = call(parse_layout, text, allowed=(LayoutSyntaxError,))
    if exc is None:
        _check_stages(stages)


@FUZZ
@given(case=structured_layouts())
def test_parse_layout_unrolls_like_megatron(case):
    """Well-formed strings unroll exactly as an independent implementation does; an oversized one is
    a LayoutSyntaxError (never a MemoryError or a hang)."""
    text, expected, group_len, final_len = case
    stages, exc = call(parse_layout, text, allowed=(LayoutSyntaxError,))
    if max(group_len, final_len) <= 10_000 and _unroll(text).count("|") < 1000:
        assert exc is None, f"{text!r} is a small well-formed layout but was refused: {exc}"
    if max(group_len, final_len) > MAX_EXPANDED + len(text):
        assert exc is not None, f"{text!r} expands to {final_len} tokens but was accepted"
    if exc is None and expected is not None:
        assert stages == expected


@FUZZ
@given(text=LAYOUT_TEXT, pp=st.one_of(st.none(), st.integers(-1, 12), st.just(4097)), vpp=VPP, mtp=MTP,
       first=st.one_of(st.none(), st.integers(-1, 20)), account=st.booleans(), num_layers=NUM_LAYERS)
@example(text="(|)*1000000", pp=None, vpp=None, mtp=None, first=None, account=False, num_layers=78)  # found: 26 s
def test_materialise_layout_raises_only_layout_input_error(text, pp, vpp, mtp, first, account, num_layers):
    """materialise(pp=, layout=): rule violations come back in .errors; only LayoutInputError raises,
    and exactly when parse_layout refuses the string (or a count is out of range)."""
    _, syntax = call(parse_layout, text, allowed=(LayoutSyntaxError,))
    spec = PipelineSpec(pp=pp, layout=text, vpp=vpp, mtp_layers=mtp, first=first, account_for_embedding=account)
    plan, exc = call(materialise, spec, num_layers, default_mtp=1, allowed=(LayoutInputError,))
    if syntax is not None:
        assert exc is not None
    if exc is None:
        assert isinstance(plan, StagePlan)
        assert all(e.message for e in plan.errors)
        if plan.stages:
            assert len(plan.stages) == plan.pp * plan.vpp
            assert sum(plan.sizes) == sum(s.count("t") for s in parse_layout(text))
        if first is not None or account:
            assert any(e.code == "layout_conflict" for e in plan.errors)


# the public limits: the web form takes 20,000 characters, the CLI and the core 100,000
@pytest.mark.parametrize("text", [
    pytest.param("(" * 20_000, id="20k-open-parens"),
    pytest.param("(t" * 10_000, id="10k-open-groups"),
    pytest.param("(Et|" * 5_000, id="5k-unclosed-stage-groups"),
])
def test_parse_layout_is_fast_on_unbalanced_groups(text):
    """A 20,000-character layout (the web's limit) parses or is refused in well under a second."""
    call(parse_layout, text, allowed=(LayoutSyntaxError,), limit=1.0)


@TIMING
@given(unit=st.text(st.sampled_from(LAYOUT_ALPHABET), min_size=1, max_size=6), size=st.integers(1_000, 20_000))
def test_parse_layout_time_is_linear(unit, size):
    """Any layout up to the web's 20,000-character limit, including long repetitions of one unit
    (the classic regex-backtracking trigger), is handled in under a second."""
    text = (unit * (size // len(unit) + 1))[:size]
    call(parse_layout, text, allowed=(LayoutSyntaxError,), limit=1.0)


# --------------------------------------------------------------------------- launcher: parse_launcher

FLAG_NAMES = sorted(KNOWN_VALUE_FLAGS | KNOWN_SWITCH_FLAGS) + ["--num-layers", "--foo", "--nproc_per_node", "--pipeline_model_parallel_size"]
BASH_WORDS = st.one_of(
    st.sampled_from(FLAG_NAMES),
    st.sampled_from(FLAG_NAMES).map(lambda f: f + "="),
    st.integers(-5, 100).map(str),
    st.sampled_from([
        "$PP", "${PP}", "${PP:-4}", "${PP-4}", "${PP:=8}", "${PP:+2}", "${PP:?}", "${ARGS[@]}", "${ARGS[*]}",
        "${ARGS[1]}", "${#PP}", "${#ARGS[@]}", "$((PP*2))", "$(( (1+2) * 3 / 0 ))", "$((1 % 0))", "$((0x1F))",
        "$((08))", "$((9999999999999999999999))", "$(( -(-(-1)) ))", "$(nproc)", "`hostname`", "$1", "$@", "$?",
        "'single quoted'", '"double $PP quoted"', '"unterminated', "'unterminated", "\\\n", "\\", "#comment",
        "PP=8", "PP+=1", "export PP=4", "readonly X=2", "local Y=3", "declare -a ARGS", "unset PP",
        "ARGS=(", "ARGS+=(", ")", "(", "{", "}", ";", ";;", "&&", "||", "|", "&", ">", ">>", "<", "2>&1",
        "<<EOF", "<<-'EOF'", "EOF", "<<<", "if", "then", "fi", "for i in 1 2; do", "done", "case $x in", "esac",
        "source x.sh", ". ./env.sh", "torchrun", "python", "pretrain_gpt.py", "${", "$((", "$(", "${PP:-${Q:-${R:-1}}}",
        "$((" * 40 + "1" + "))" * 40, "${X:-" * 40 + "1" + "}" * 40, "\ufeff", "\r\n", "\t",
    ]),
    st.text(CHARS, max_size=12),
)
LAUNCHER_TEXT = st.one_of(
    st.lists(st.tuples(BASH_WORDS, st.sampled_from([" ", " ", "\n", " \\\n  ", "", "\t"])), max_size=60).map(
        lambda ws: "".join(w + sep for w, sep in ws)),
    TEXT,
    st.binary(max_size=200),
)


def _check_launcher(parsed: LauncherParse) -> None:
    assert isinstance(parsed, LauncherParse)
    assert set(parsed.values) <= KNOWN_VALUE_FLAGS
    assert set(parsed.switches) <= KNOWN_SWITCH_FLAGS
    for flag in parsed.values:
        try:
            parsed.int_value(flag)
        except ValueError as exc:
            assert type(exc) is ValueError and flag in str(exc)


@FUZZ
@given(text=LAUNCHER_TEXT)
@example(text="python train.py --mtp-num-layers 1000000000\n")  # found: a billion MTP depths walked (a hang)
def test_parse_launcher_raises_only_launcher_error(text):
    """parse_launcher: a LauncherParse whose values/switches are known flags, or LauncherError; and
    launcher_request + run_check on it raise only the layout/pattern input errors."""
    parsed, exc = call(parse_launcher, text, allowed=(LauncherError,))
    if exc is not None:
        assert isinstance(text, bytes), f"str input refused: {exc}"
        return
    _check_launcher(parsed)
    req, _ = call(launcher_request, parsed, GLM)
    if not req.unresolved:
        call(run_check, GLM, req.spec, "megatron", freq=req.freq, offset=req.offset,
             extra_errors=req.errors, allowed=(LayoutInputError, PatternError))


def test_parse_launcher_size_limit():
    big = "# x\n" * ((1 << 20) // 4 + 1)
    for text in (big, big.encode(), b"\xff\xfe bad utf-8"):
        _, exc = call(parse_launcher, text, allowed=(LauncherError,))
        assert exc is not None


@TIMING
@given(unit=st.lists(BASH_WORDS, min_size=1, max_size=4).map(" ".join), size=st.integers(5_000, 60_000))
def test_parse_launcher_time_on_long_repetitions(unit, size):
    """Long repetitions of one fragment (60,000 characters) are read in a couple of seconds."""
    text = (unit * (size // max(len(unit), 1) + 1))[:size]
    call(parse_launcher, text, allowed=(LauncherError,))


# --------------------------------------------------------------------------- model_config: load_config_bytes


class Big:
    """An integer too long for json.dumps (which refuses > 4,300 digits): serialised textually."""

    def __init__(self, digits: int, sign: str = ""):
        self.digits, self.sign = digits, sign


class Deep:
    """``value`` wrapped in ``depth`` lists or objects, serialised textually (json.dumps would recurse)."""

    def __init__(self, depth: int, value: Any, kind: str = "list"):
        self.depth, self.value, self.kind = depth, value, kind


def dumps(obj: Any) -> bytes:
    """json.dumps with Big / Deep placeholders; NaN and Infinity are written as Python does."""
    subs: dict[str, str] = {}

    def prepare(v: Any) -> Any:
        if isinstance(v, Big):
            key = f"@@{len(subs)}@@"
            subs[key] = v.sign + "1" + "0" * (v.digits - 1)
            return key
        if isinstance(v, Deep):
            key = f"@@{len(subs)}@@"
            inner = dumps(prepare(v.value)).decode()
            for k, s in subs.items():
                inner = inner.replace(json.dumps(k), s)
            subs[key] = ('{"k":' * v.depth + inner + "}" * v.depth) if v.kind == "dict" else (
                "[" * v.depth + inner + "]" * v.depth)
            return key
        if isinstance(v, dict):
            return {k: prepare(x) for k, x in v.items()}
        if isinstance(v, list):
            return [prepare(x) for x in v]
        return v

    text = json.dumps(prepare(obj))
    for key, s in subs.items():
        text = text.replace(json.dumps(key), s)
    return text.encode("utf-8", "surrogatepass")


JSON_LEAF = st.one_of(
    st.none(), st.booleans(), INTS, st.floats(), TEXT,
    st.integers(4_000, 6_000).map(Big), st.sampled_from([1e308, -0.0, 1e-320, 2.5, 78.0]),
)
JSON_VALUE = st.recursive(JSON_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=5), st.dictionaries(TEXT, kids, max_size=5)), max_leaves=20)
# the same without Big: values json.loads can return (for the Python-level receipt verifier)
JSON_PY = st.recursive(JSON_LEAF.filter(lambda v: not isinstance(v, Big)), lambda kids: st.one_of(
    st.lists(kids, max_size=5), st.dictionaries(TEXT, kids, max_size=5)), max_leaves=20)
PRESET = json.loads(PRESET_FILE.read_text())
FIELDS = sorted(PRESET)


@st.composite
def mutated_presets(draw) -> Any:
    """The GLM-5.2 preset with 1-4 mutations: a changed type, size, list length, deep nesting, a
    removed or added key; sometimes not even an object."""
    cfg = copy.deepcopy(PRESET)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(FIELDS + ["num_hidden_layers", "indexer_types", "mlp_layer_types",
                                            "index_topk_pattern", "hidden_size", "extra_field"]))
        op = draw(st.sampled_from(["value", "size", "list_len", "list_entry", "nest", "delete", "pattern"]))
        if op == "value":
            cfg[key] = draw(JSON_VALUE)
        elif op == "size":
            cfg[key] = draw(st.one_of(INTS, st.floats(), st.sampled_from([0, -1, 1 << 31, 1 << 64, 78.5, "78", True]),
                                      st.integers(4_000, 6_000).map(Big), st.integers(30, 400).map(lambda d: Big(d, "-"))))
        elif op == "list_len":
            n = draw(st.integers(0, 200))
            cfg[key] = draw(st.sampled_from([["full"] * n, ["dense"] * n, ["shared", "full"] * (n // 2), list(range(n))]))
        elif op == "list_entry" and isinstance(cfg.get("indexer_types"), list) and cfg["indexer_types"]:
            which = draw(st.sampled_from(["indexer_types", "mlp_layer_types"]))
            if isinstance(cfg.get(which), list) and cfg[which]:
                cfg[which][draw(st.integers(0, len(cfg[which]) - 1))] = draw(JSON_LEAF)
        elif op == "nest":
            cfg[key] = Deep(draw(st.sampled_from([1, 30, 62, 63, 64, 65, 200, 5000])), cfg.get(key),
                            draw(st.sampled_from(["list", "dict"])))
        elif op == "delete":
            cfg.pop(key, None)
        elif op == "pattern":
            n = draw(st.sampled_from([78, 77, 79, 0, 1]))
            cfg["index_topk_pattern"] = draw(st.text(st.sampled_from("FSx"), min_size=n, max_size=n))
    shape = draw(st.sampled_from(["object"] * 8 + ["array", "deep"]))
    return [cfg] if shape == "array" else Deep(70, cfg, "dict") if shape == "deep" else cfg


def _check_config(cfg: Any) -> None:
    assert isinstance(cfg, ModelConfig)
    assert 1 <= cfg.num_hidden_layers <= 4096
    for arr in (cfg.indexer_types, cfg.mlp_layer_types):
        assert arr is None or len(arr) == cfg.num_hidden_layers
    assert cfg.id.startswith("sha256:") and len(cfg.sha256) == 64


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), st.binary(max_size=40).map(lambda b: b"\xef\xbb\xbf" + b)))
def test_load_config_random_bytes(data):
    """Random bytes: a config or ConfigError, never a decoding or parsing exception."""
    cfg, exc = call(load_config_bytes, data, allowed=(ConfigError,))
    if exc is None:
        _check_config(cfg)


@FUZZ
@given(value=st.one_of(JSON_VALUE, st.dictionaries(st.sampled_from(FIELDS), JSON_VALUE, max_size=12)))
def test_load_config_random_json(value):
    """Random JSON values (big ints, floats, lone-surrogate escapes, nesting): a config or ConfigError."""
    cfg, exc = call(load_config_bytes, dumps(value), allowed=(ConfigError,))
    if exc is None:
        _check_config(cfg)


@FUZZ
@given(cfg=mutated_presets(), wrap=st.sampled_from(["none", "none", "none", "bom", "trailing", "dupkey", "ws"]))
@example(cfg={**PRESET, "num_hidden_layers": Big(5000)}, wrap="none")  # found: int-conversion ValueError
@example(cfg={**PRESET, "note": "\ud800"}, wrap="none")  # found: UnicodeEncodeError in canonical_digest
@example(cfg={**PRESET, "\udc80": 1}, wrap="none")
def test_load_config_mutated_preset(cfg, wrap):
    """Mutated copies of the GLM-5.2 preset: a config or ConfigError naming the problem."""
    data = dumps(cfg)
    if wrap == "bom":
        data = b"\xef\xbb\xbf" + data
    elif wrap == "trailing":
        data += b" x"
    elif wrap == "dupkey":
        data = data[:-1] + b', "hidden_size": 1}'
    elif wrap == "ws":
        data = b"\n\t " + data.replace(b",", b" ,\n ") + b"\n"
    result, exc = call(load_config_bytes, data, allowed=(ConfigError,))
    if exc is None:
        _check_config(result)


#: one config.json of every family isplan reads (tests/core/model/test_model_families.py), multimodal files
#: included: a mutation of any of them must load or be refused by name, whatever family code it reaches
FAMILY_FILES: list[dict[str, Any]] = []


def _family_files() -> list[dict[str, Any]]:
    if not FAMILY_FILES:
        from tests.core.model import test_model_families as fam

        FAMILY_FILES.extend(v for k, v in sorted(vars(fam).items())
                            if k.isupper() and isinstance(v, dict) and "model_type" in v)
        FAMILY_FILES.append({"model_type": "qwen3_vl", "text_config": {**fam.QWEN3_8B, "model_type": "qwen3_vl_text"}})
        FAMILY_FILES.append({"model_type": "qwen2_5_vl", **fam.QWEN2_7B, "vision_config": {}})
    return FAMILY_FILES


@st.composite
def mutated_family_files(draw) -> Any:
    """A family's config.json with 1-4 of its keys (or its text_config's) replaced by any JSON value,
    deleted, or a key of another family added."""
    files = _family_files()
    cfg = copy.deepcopy(draw(st.sampled_from(files)))
    keys = sorted({k for f in files for k in f} | {k for f in files for k in f.get("text_config", {})})
    for _ in range(draw(st.integers(1, 4))):
        target = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and draw(st.booleans()) else cfg
        key = draw(st.sampled_from(sorted(target) + keys))
        if draw(st.integers(0, 4)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(JSON_VALUE)
    return cfg


@FUZZ
@given(cfg=mutated_family_files())
@example(cfg={"model_type": "mistral3", "text_config": {"model_type": ["ministral3"]}})  # found: TypeError in the lookup
def test_load_config_mutated_family_files(cfg):
    """Mutated config.json files of every family: a config or ConfigError naming the problem."""
    result, exc = call(load_config_bytes, dumps(cfg), allowed=(ConfigError,))
    if exc is None:
        _check_config(result)


def test_load_config_limits():
    for data in (b" " * (MAX_CONFIG_BYTES + 1), b"[" * 100_000, b'{"a":' * 70 + b"1" + b"}" * 70):
        _, exc = call(load_config_bytes, data, allowed=(ConfigError,))
        assert exc is not None


# --------------------------------------------------------------------------- web: plan_from_query / build_view

STATE_KEYS = list(BY_URL)
STATE_VALUE = st.one_of(
    TEXT,
    INTS.map(str),
    st.integers(-5, 300).map(lambda v: f" {v} "),
    st.sampled_from(["", " ", "0", "1", "true", "false", "on", "off", "nan", "inf", "-inf", "1e400", "1_000", "٣",
                     "²", "--5", "0x10", "glm-5.2", "glm-5.1", "deepseek-v3.2", "sha256:" + "0" * 64, "sha256:zz",
                     "megatron", "slime", "hf", "flags", "split", "layout", "none", "selective", "full", "custom",
                     "h100-80gb", "mi300x-192gb", "FSSS", "F", "S" * 78, "FSxx", "14,8,8,8,8,8,8,16",
                     "10,10,10,10,10,10,9,9", "78", "Et*3|(tt|)*29,m|L", "Et*13|(t*8|)*6t*16mL", "(" * 500]),
    st.text(st.sampled_from(LAYOUT_ALPHABET), max_size=40),
    SPLIT_TEXT,
)
STATE_PARAMS = st.dictionaries(st.sampled_from(STATE_KEYS + ["action", "unknown"]), STATE_VALUE, max_size=10)


def _valid_int(lo: float | None, hi: float | None, raw: str) -> bool:
    text = raw.strip()
    return bool(re.fullmatch(r"[+-]?[0-9]{1,12}", text)) and (lo or 0) <= int(text) <= (hi or 0)


def _valid(key: str, raw: str) -> bool:
    """Whether ``raw`` is a usable value for URL key ``key``, by the bounds in the plan table,
    decided here without the plan parser."""
    spec = TABLE[BY_URL[key]]
    if spec.kind == "int":
        return _valid_int(spec.lo, spec.hi, raw)
    if spec.kind == "choice":
        return raw in spec.choices
    if spec.kind == "bool":
        return raw.strip().lower() in ("0", "1", "true", "false", "on", "off")
    if spec.kind == "float":
        try:
            return bool((spec.lo or 0) <= float(raw) <= (spec.hi or 0))
        except ValueError:
            return False
    if spec.kind == "choices":   # a comma list of the choices, each once at most
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        return bool(parts) and all(p in spec.choices for p in parts) and len(parts) <= len(spec.choices)
    if spec.kind == "sizes":
        parts = raw.split(",")
        return len(raw) <= spec.max_len and all(
            re.fullmatch(r"[+-]?[0-9]{1,9}", p.strip()) and 0 <= int(p) <= (spec.hi or 0) for p in parts)
    return len(raw) <= spec.max_len


def _world(params: dict[str, str]) -> int:
    """TP x CP x PP x DP of the valid values given (1 for the others; a split, when it is the layout -
    ``mode=split``, or no mode and no layout string -, has at least PP x VPP stages), re-derived here:
    the plan bounds this product as well as each factor. A setting's own key wins over its aliases,
    else the first alias given, as the parser reads them."""
    chosen: dict[str, str] = {}
    for key, raw in params.items():
        name = BY_URL.get(key)
        if name is not None and (key == name or name not in chosen):
            chosen[name] = raw

    def given(name: str) -> str | None:
        raw = chosen.get(name)
        return raw if raw is not None and raw.strip() and _valid(name, raw) else None

    def value(name: str) -> int:
        raw = given(name)
        return max(1, int(raw)) if raw is not None else 1
    mode, split = given("mode"), given("split")
    uses_split = split is not None and (mode == "split" or (mode is None and given("layout") is None))
    pp = max(value("pp"), len(split.split(",")) // value("vpp")) if uses_split and split else value("pp")
    return value("tp") * value("cp") * pp * value("dp")


@FUZZ
@given(params=STATE_PARAMS)
def test_plan_from_query_never_raises_and_reports_each_bad_field(params):
    """plan_from_query never raises; a bad value keeps the default and is named among the problems."""
    (plan, problems), _ = call(plan_from_query, params)
    assert isinstance(plan, Plan)
    named = {p.field for p in problems}
    assert all(isinstance(p.message, str) and p.message for p in problems)
    for key, raw in params.items():
        if key not in STATE_KEYS or not raw.strip():
            continue
        name = BY_URL[key]
        if key != name and name in params:
            continue   # a setting given under its name wins over an earlier alias of it
        if _valid(key, raw):
            if name == "dp" and _world(params) > MAX_GPUS:
                assert "dp" in named   # each factor in bounds, their product not: named on dp
            elif name not in ("split", "layout", "conv_split", "conv_pp"):  # those also carry mode= messages
                assert name not in named, (key, raw)
        else:
            assert name in named, (key, raw)   # named by the setting's one name, whatever alias was used
            assert getattr(plan, name) == getattr(Plan(), name) or name in ("mode", "conv", "parallel")  # derived


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = ConfigStore(tmp_path_factory.mktemp("fuzz-store") / "configs.sqlite3")
    s.put(json.dumps(tiny_config(8)).encode(), name="tiny")
    return s


@FEW
@given(params=STATE_PARAMS)
@example(params={"split": "79"})  # found: IndexError in stage_params for a split past the last layer
@example(params={"split": "14,8,8,8,8,8,8,18"})
@example(params={"pattern": "X", "layout": "Q"})  # found: LayoutInputError escaped build_view
def test_build_view_never_raises(store, params):
    """build_view(plan_from_query(...)) never raises for any query; field problems are in field_errors."""
    plan, problems = plan_from_query(params)
    view, _ = call(build_view, plan, problems, store)
    assert isinstance(view, PlanView)
    assert {p.field for p in problems} <= set(view.field_errors)


@pytest.mark.parametrize("params", [
    pytest.param({"pattern": "X", "layout": "Q"}, id="bad-pattern-and-bad-layout"),
    pytest.param({"pattern": "X", "mode": "split", "split": "1,2,3", "vpp": "2"}, id="bad-pattern-and-split-vpp"),
    pytest.param({"pattern": "F" * 100, "pp": "0"}, id="long-pattern-and-pp"),
])
def test_build_view_bad_pattern_with_bad_layout(store, params):
    """A bad pattern together with an unusable layout is two field messages, not an exception."""
    plan, problems = plan_from_query(params)
    view, _ = call(build_view, plan, problems, store)
    assert "pattern" in view.field_errors


# --------------------------------------------------------------------------- receipts: verify_receipt


@lru_cache(maxsize=1)
def _receipt_json() -> str:
    receipt = build_receipt(load_preset("glm-5.2"), [("training", PipelineSpec(pp=8, first=14, last=16), None, None, ())])
    return json.dumps(receipt)


def real_receipt() -> dict[str, Any]:
    return json.loads(_receipt_json())


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _check_report(report: Any) -> None:
    assert isinstance(report, dict)
    assert isinstance(report["ok"], bool) and isinstance(report["summary"], str)
    assert isinstance(report["differences"], list) and all(isinstance(d, str) for d in report["differences"])
    assert report["ok"] == (not report["differences"])


def test_real_receipt_verifies():
    report, _ = call(verify_receipt, real_receipt())
    _check_report(report)
    assert report["ok"], report["differences"]


@FUZZ
@given(value=st.one_of(JSON_PY, st.fixed_dictionaries({
    "model": st.one_of(JSON_PY, st.fixed_dictionaries({"source": st.sampled_from(["preset", "path", "upload"]),
                                                            "id": st.one_of(st.sampled_from(list(preset_ids())), TEXT)})),
    "layouts": st.one_of(JSON_PY, st.lists(st.one_of(JSON_PY, st.fixed_dictionaries({"inputs": JSON_PY})), max_size=3)),
    "engine": st.one_of(JSON_PY, st.fixed_dictionaries({"semantics": st.sampled_from(["megatron", "slime", "hf"])})),
}, optional={"pattern": JSON_PY, "checks": JSON_PY, "tool": JSON_PY, "body_sha256": JSON_PY,
             "valid": JSON_PY, "unpinned": JSON_PY})))
# found: TypeError / AttributeError / UnicodeEncodeError on fields of the wrong type
@example(value={"model": {"source": "preset", "id": "glm-5.2"}, "layouts": [], "engine": {"semantics": "megatron"}, "checks": None})
@example(value={"model": {"source": "preset", "id": "\ud800"}, "layouts": [], "engine": {"semantics": "megatron"}})
@example(value={"model": {"source": "preset", "id": "glm-5.2", "revision": 5}, "layouts": [], "engine": {"semantics": "hf"}})
@example(value={"model": {"source": "preset", "id": "glm-5.2"}, "engine": {"semantics": "megatron"}, "pattern": 1,
                "layouts": [{"inputs": {"pp": "8"}, "dsa_indexer_topk_freq": {}}]})
def test_verify_random_json(value):
    """verify_receipt on any JSON value: a report or ReceiptError, nothing else."""
    report, exc = call(verify_receipt, value, allowed=(ReceiptError,))
    if exc is None:
        _check_report(report)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


@st.composite
def mutations(draw, paths: list[tuple]) -> tuple[tuple, str, Any]:
    path = draw(st.sampled_from(paths))
    # "insert" next to a digest would add a sibling key, not edit the digest
    op = draw(st.sampled_from(["replace", "replace", "delete"] + ([] if path in DIGEST_PATHS else ["insert"])))
    new = draw(st.one_of(JSON_PY, st.sampled_from([0, 1, 14, 15, 16, 78, True, False, None, "full", "shared", [], {}])))
    return path, op, new


def _apply(receipt: dict[str, Any], path: tuple, op: str, new: Any) -> None:
    parent = _get(receipt, path[:-1])
    key = path[-1]
    if op == "replace":
        parent[key] = new
    elif op == "delete":
        del parent[key]
    elif isinstance(parent, list):
        parent.insert(key, new)
    else:
        parent[f"{key}_extra"] = new


DIGEST_PATHS = [("body_sha256",), ("model", "sha256"), ("model", "canonical_sha256")]
RECEIPT_PATHS = _paths(real_receipt())
STAGE_PATHS = [p for p in RECEIPT_PATHS if len(p) >= 4 and p[0] == "layouts" and p[2] == "stages"]


@FUZZ
@given(muts=st.lists(mutations(RECEIPT_PATHS), min_size=1, max_size=3))
def test_verify_mutated_receipt_anywhere(muts):
    """Any edit of a real receipt (without re-signing) is reported: ok is False, or ReceiptError."""
    receipt = real_receipt()
    for path, op, new in muts:
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier mutation removed the parent
            _apply(receipt, path, op, new)
    assume(_canon(receipt) != _canon(real_receipt()))
    report, exc = call(verify_receipt, receipt, allowed=(ReceiptError,))
    if exc is None:
        _check_report(report)
        assert not report["ok"], f"edited receipt verified: {muts}"


@FUZZ
@given(mut=mutations(STAGE_PATHS + DIGEST_PATHS * 10), resign=st.booleans())
def test_verify_detects_stage_and_digest_edits_even_when_resigned(mut, resign):
    """An edited stage record or config digest is a difference even when the editor recomputed
    body_sha256 (re-signing), so the body digest is not the only line of defence."""
    receipt = real_receipt()
    path, op, new = mut
    before = copy.deepcopy(_get(receipt, path[:-1]))
    _apply(receipt, path, op, new)
    # values Python compares equal (1 == True == 1.0) are the same number to the verifier
    assume(_get(receipt, path[:-1]) != before)
    if resign and path != ("body_sha256",):
        receipt["body_sha256"] = canonical_body_digest(receipt)
    report, exc = call(verify_receipt, receipt, allowed=(ReceiptError,))
    if exc is None:
        _check_report(report)
        assert not report["ok"], f"edit {mut} verified"


# --------------------------------------------------------------------------- CLI: app.cli.main


def _cli_flags() -> dict[str, list[argparse.Action]]:
    from app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: [a for a in p._actions if a.option_strings and a.dest != "help"] for name, p in sub.choices.items()}


CLI_FLAGS = _cli_flags()
ALL_ACTIONS = [a for acts in CLI_FLAGS.values() for a in acts]


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-fuzz")
    (d / "tiny.json").write_text(json.dumps(tiny_config(8)))
    (d / "dir").mkdir()
    (d / "dir" / "config.json").write_text(json.dumps(tiny_config(12)))
    (d / "bad.json").write_text("{not json")
    (d / "receipt.json").write_text(_receipt_json())
    return d


INT_VALUES = st.one_of(st.integers(-3, 20), st.integers(-3, 300), st.sampled_from([0, 1, 2, 4, 8, 14, 16, 78, 256, 4096, 10**9, 10**12]))


def cli_value(action: argparse.Action, files: Path) -> st.SearchStrategy[str]:
    name = action.option_strings[-1]
    if action.choices:
        return st.one_of(st.sampled_from(list(action.choices)), TEXT)
    if action.type is int:
        return st.one_of(INT_VALUES.map(str), TEXT, st.sampled_from(["1_0", " 8", "0x8", "٣"]))
    if action.type is float:
        return st.one_of(st.floats().map(repr), st.sampled_from(["nan", "inf", "-inf", "1e400", "80", "0", "-1", "1e-9"]), TEXT)
    if name in ("--split", "--near"):
        return st.one_of(SPLIT_TEXT, st.sampled_from(["14,8,8,8,8,8,8,16", "10,10,10,10,10,10,9,9", "78", "39,39"]))
    if name == "--layout":
        return st.one_of(LAYOUT_TEXT, st.sampled_from(["Et*3|(tt|)*29,m|L", "Et*13|(t*8|)*6t*16mL"]))
    if name == "--pattern":
        return st.one_of(st.text(st.sampled_from("FSfs x"), max_size=90), TEXT)
    if name == "--launcher":
        return st.sampled_from(["@launcher", "-", str(files / "missing.sh"), str(files / "dir")])
    if name == "--config":
        return st.sampled_from([str(files / "tiny.json"), str(files / "bad.json"), str(files / "missing.json"),
                                str(files / "dir"), str(REPO / "app/core/presets/glm-5.2.json")])
    if name == "--also":
        return st.one_of(st.sampled_from(["conversion=--pp 2 --last 40", "c=--split 78", "=--pp 2", "x=--pp \"2",
                                          "x=--pp 'a", "noequals", "x=--bogus", "training=--pp 8"]),
                         TEXT.map(lambda t: "x=" + t))
    if name in ("--model-revision", "--engine-commit"):
        return st.one_of(st.just("a" * 40), st.just("main"), TEXT)
    if name == "--gpu":
        return st.one_of(st.sampled_from(["h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb", "custom"]), TEXT)
    return TEXT


MODELS = ["glm-5.2", "glm-5.1", "deepseek-v3.2", "@tiny", "@dir", "@bad", "@missing", "nonexistent-model", ""]


@st.composite
def cli_argv(draw, files: Path) -> tuple[list[str], str]:
    """An argv of a real subcommand with 0-7 of its flags (sometimes another subcommand's), and stdin."""
    if draw(st.integers(0, 30)) == 0:
        return draw(st.sampled_from([[], ["--version"], ["-h"], ["bogus"], ["check"], ["check", "-h"]])), ""
    command = draw(st.sampled_from(sorted(CLI_FLAGS)))
    argv = [command]
    if command == "verify":
        argv.append(draw(st.sampled_from(["@receipt", "-", "@missing"])))
    elif command != "search" or draw(st.booleans()):
        argv.append(draw(st.sampled_from(MODELS)))
    for _ in range(draw(st.integers(0, 7))):
        pool = CLI_FLAGS[command] if draw(st.integers(0, 9)) else ALL_ACTIONS
        action = draw(st.sampled_from(pool))
        argv.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            argv.append(draw(cli_value(action, files)))
    if command in ("plan", "search") and draw(st.integers(0, 4)):
        argv += ["--pp", str(draw(st.integers(1, 12)))] if command == "plan" else ["--gpus", str(draw(st.integers(1, 4096)))]
    stdin = draw(st.one_of(LAUNCHER_TEXT.map(lambda t: t if isinstance(t, str) else t.decode("latin-1")),
                           st.just(_receipt_json()), JSON_VALUE.map(lambda v: dumps(v).decode("utf-8", "replace"))))
    return argv, stdin


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_cli_exit_codes(cli_files, data):
    """isplan with random arguments returns 0, 1 or 2 (argparse exits 0 or 2) and never raises."""
    argv, stdin = data.draw(cli_argv(cli_files))
    launcher = cli_files / "launcher.sh"
    launcher.write_text(data.draw(LAUNCHER_TEXT.map(lambda t: t if isinstance(t, str) else t.decode("latin-1"))),
                        errors="surrogatepass")
    receipt = cli_files / "edited-receipt.json"
    receipt.write_text(data.draw(st.one_of(st.just(_receipt_json()),
                                           JSON_VALUE.map(lambda v: dumps(v).decode("utf-8", "surrogatepass")))),
                       errors="surrogatepass")
    names = {"@launcher": launcher, "@receipt": receipt, "@tiny": cli_files / "tiny.json", "@dir": cli_files / "dir",
             "@bad": cli_files / "bad.json", "@missing": cli_files / "missing.json"}
    argv = [str(names[a]) if a in names else a for a in argv]
    note(f"argv = {argv!r}")
    code = run_cli(argv, stdin)
    assert code in (0, 1, 2), f"isplan {argv} returned {code!r}"


def run_cli(argv: list[str], stdin: str) -> Any:
    from app.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code, _ = call(main, argv, limit=10.0)
            except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2)
                assert exc.code in (0, 2), f"argparse exited with {exc.code!r}"
                return exc.code
    finally:
        sys.stdin = old_stdin
    if code == 2:
        assert err.getvalue().strip(), "exit 2 without a message on stderr"
    return code


@pytest.mark.parametrize("argv, stdin", [
    pytest.param(["check", "glm-5.2", "--split", "14,8,8,8,8,8,8,16", "--dsa-topk-freq", "0"], "", id="check-topk-freq-0"),
    pytest.param(["roles", "glm-5.2", "--dsa-skip-topk-offset", "-1"], "", id="roles-negative-offset"),
    pytest.param(["receipt", "glm-5.2", "--split", "14,8,8,8,8,8,8,16", "--also", 'x=--pp "2'], "",
                 id="receipt-also-unbalanced-quote"),
    pytest.param(["memory", "glm-5.2", "--pp", "8", "--first", "14", "--last", "16", "--gpu-memory-gb", "nan"], "",
                 id="memory-gpu-gb-nan"),
    pytest.param(["search", "--gpus", "64", "--gpu", "custom", "--gpu-memory-gb", "inf"], "", id="search-gpu-gb-inf"),
    pytest.param(["check", "glm-5.2", "--split", "²"], "", id="check-split-superscript-digit"),
    pytest.param(["verify", "-"], '{"a": 1' + "0" * 5000 + "}", id="verify-huge-int"),
    pytest.param(["verify", "-"], '{"model": {}, "layouts": [], "engine": {"semantics": "megatron"}, "x": "\\ud800"}',
                 id="verify-lone-surrogate"),
])
def test_cli_known_crashes(argv, stdin):
    """Inputs the fuzzer found that made isplan crash with a traceback (exit 1, the 'invalid' code)."""
    assert run_cli(argv, stdin) == 2


# --------------------------------------------------------------------------- the same bytes through the web app


CLIENT_OPTIONS = dict(raise_server_exceptions=False)  # the shared `client` fixture (tests/conftest.py) takes these


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(cfg=mutated_presets())
def test_upload_answers_mutated_configs_without_500(client, cfg):
    """POST /upload with a mutated preset: a redirect (stored) or a 422 page naming the problem."""
    data = dumps(cfg)
    note(f"upload {data[:300]!r}")
    r = client.post("/upload", files={"file": ("config.json", data)}, data={"query": "pp=8"}, follow_redirects=False)
    assert r.status_code in (303, 422), f"{r.status_code}: {r.text[:200]}"


@pytest.mark.parametrize("path, body", [
    pytest.param("/api/v1/verify", b'{"a": 1' + b"0" * 5000 + b"}", id="verify-huge-int"),
    pytest.param("/api/v1/verify", b'{"model": {}, "layouts": [], "engine": {"semantics": "megatron"}, "x": "\\ud800"}',
                 id="verify-lone-surrogate"),
    pytest.param("/api/v1/verify", json.dumps({"model": {"id": "glm-5.2", "source": "preset"}, "engine": {"semantics": "megatron"},
                                               "layouts": [{"inputs": {"pp": "8"}}]}).encode(), id="verify-string-pp"),
    pytest.param("/api/v1/verify", json.dumps({**real_receipt(), "checks": 0}).encode(), id="verify-checks-not-a-list"),
    pytest.param("/api/v1/verify", json.dumps({**real_receipt(), "pattern": 1}).encode(), id="verify-pattern-not-a-string"),
    pytest.param("/api/v1/verify", json.dumps({**real_receipt(), "model": {**real_receipt()["model"], "revision": 5}}).encode(),
                 id="verify-revision-not-a-string"),
    pytest.param("/upload", b'{"num_hidden_layers": 1' + b"0" * 5000 + b"}", id="upload-huge-int"),
    pytest.param("/upload", json.dumps({**PRESET, "note": "\ud800"}).encode(), id="upload-lone-surrogate"),
])
def test_web_bodies_found_by_the_fuzzers(client, path, body):
    """Bodies the fuzzers above found to crash the parsers, sent to the app: a 4xx, never a 500."""
    if path == "/upload":
        r = client.post(path, files={"file": ("config.json", body)}, follow_redirects=False)
    else:
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code < 500, f"{path} answered {r.status_code}"


@pytest.mark.parametrize("query", ["split=80", "split=14,8,8,8,8,8,8,18", "split=%C2%B2", "pattern=X&layout=Q"])
@pytest.mark.parametrize("path", ["/", "/api/v1/plan", "/api/v1/params"])
def test_web_queries_found_by_the_fuzzers(client, path, query):
    """Queries the build_view / split-parsing fuzzers found, sent to the app: never a 500, and the page
    stays a page (HTML with the field message, not the JSON error of the API)."""
    r = client.get(f"{path}?{query}")
    assert r.status_code < 500, f"{path}?{query} answered {r.status_code}"
    if path == "/":
        assert r.headers["content-type"].startswith("text/html"), f"/?{query} answered {r.headers['content-type']}"
