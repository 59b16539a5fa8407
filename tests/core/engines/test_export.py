"""Exports: every Megatron flag exists in Megatron's parser, exports parse back to the same stages,
and every export is inert, valid bash (nothing in a value is ever executed)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.engines.megatron.check import run_check
from app.core.engines.megatron.export import (
    ExportSettings,
    exports,
    megatron_argv,
    megatron_text,
    shell_join,
    slime_argv,
    slime_perf_args,
)
from app.core.engines.megatron.placement import materialise
from app.core.launcher import launcher_request, parse_launcher
from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_model
from app.core.plan import Plan
from app.core.plan.table import CP_COMM_TYPES, RECOMPUTE_MODULES
from tests.conftest import make_config, tiny_config

DATA = Path(__file__).resolve().parents[3] / "app/core/data/megatron_arguments.txt"
# slime's own flags (THUDM/slime slime/utils/arguments.py at 624b824a: "--allgather-cp" line 297,
# "--use-dynamic-batch-size" line 747, "--max-tokens-per-gpu" line 758); everything else slime
# forwards to Megatron's parser
SLIME_OWN = {"--allgather-cp", "--use-dynamic-batch-size", "--max-tokens-per-gpu"}
BASH = shutil.which("bash")


def megatron_shapes() -> dict[str, tuple[str, ...]]:
    """Every option string of Megatron's parser -> (switch | value, nargs, type, choices), as
    scripts/megatron_arguments.py read them from the source."""
    lines = DATA.read_text().splitlines()
    assert lines[0].startswith("# NVIDIA/Megatron-LM option strings at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553")
    out = {}
    for line in lines:
        if line.startswith("-"):
            flag, *shape = line.split("\t")
            assert len(shape) == 4, line
            out[flag] = tuple(shape)
    return out


SHAPES = megatron_shapes()
OPTIONS = set(SHAPES)
_TYPES = {"int": int, "float": float}


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron's parser rebuilt from the option list: every option with its action, nargs, type and
    choices, and no abbreviations (``megatron/training/arguments.py`` builds its parser with
    ``allow_abbrev=False``); an unknown option or a value it cannot read exits, as parse_args does."""
    parser = argparse.ArgumentParser(prog="pretrain_gpt.py", allow_abbrev=False, add_help=False)
    for flag, (kind, nargs, typ, choices) in SHAPES.items():
        dest = flag.lstrip("-").replace("-", "_")
        if kind == "switch":
            parser.add_argument(flag, dest=dest, action="store_true")
            continue
        convert = _TYPES.get(typ, str)
        parser.add_argument(flag, dest=dest, type=convert, nargs=None if nargs == "1" else int(nargs) if nargs.isdigit()
                            else nargs, choices=None if choices == "-" else [convert(c) for c in choices.split(",")])
    return parser


def parses(argv: list[str], own: set[str] = frozenset()) -> argparse.Namespace:
    """``argv`` through Megatron's parser; options in ``own`` (slime's) and their values are left out."""
    kept, skip = [], False
    for a in argv:
        if skip and not a.startswith("--"):
            continue
        skip = a in own
        if not skip:
            kept.append(a)
    try:
        return megatron_parser().parse_args(kept)
    except SystemExit:
        raise AssertionError(f"Megatron's parser refuses {shell_join(kept)}") from None


def flags(argv):
    return [a for a in argv if a.startswith("--")]


def stage_tuple(plan):
    return [(s.pp_rank, s.vp_stage, s.first_layer, s.num_layers, s.embedding, s.loss, s.mtp_layers)
            for s in plan.stages]


@st.composite
def plans(draw):
    vpp = draw(st.sampled_from([1, 1, 2, 3]))
    pp = draw(st.integers(1, 6))
    if vpp > 1 and pp == 1:
        pp = 2
    sizes = tuple(draw(st.lists(st.integers(0, 6), min_size=pp * vpp, max_size=pp * vpp)))
    n = sum(sizes)
    if n == 0:
        sizes = (1,) + sizes[1:]
        n = 1
    mtp = draw(st.integers(0, 2))
    return sizes, vpp, mtp, n


@st.composite
def export_settings(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    return ExportSettings(
        tp=tp, cp=draw(st.sampled_from([1, 2, 8])), ep=draw(st.sampled_from([1, 2, 8])),
        etp=draw(st.sampled_from([None, 1])), sp=tp > 1,
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        recompute_method=draw(st.sampled_from([None, "uniform", "block"])),
        recompute_num_layers=draw(st.one_of(st.none(), st.integers(1, 3))),
        optimizer_cpu_offload=draw(st.booleans()), overlap_cpu_optimizer_d2h_h2d=draw(st.booleans()),
        use_precision_aware_optimizer=draw(st.booleans()), distributed_optimizer=draw(st.booleans()),
        max_tokens_per_gpu=draw(st.sampled_from([None, 8192])),
        recompute_modules=draw(st.one_of(st.none(), st.lists(st.sampled_from(RECOMPUTE_MODULES), min_size=1,
                                                                max_size=3, unique=True).map(tuple))),
        distribute_saved_activations=draw(st.booleans()), moe_grouped_gemm=draw(st.booleans()),
        cp_comm_type=draw(st.sampled_from(CP_COMM_TYPES)),
        hierarchical_context_parallel_sizes=draw(st.sampled_from([None, (2,), (2, 4)])),
        seq_length=draw(st.sampled_from([None, 4096])), max_position_embeddings=draw(st.sampled_from([None, 131072])),
        model_argv=draw(st.sampled_from([(), ("--group-query-attention", "--num-query-groups", "8"),
                                         ("--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "16")])),
    )


def checked(sizes, vpp, mtp, n, freq=4, offset=0):
    # freq/offset only shape the DSA flags; "hf" reads no array, so every plan is materialised
    cfg = make_config(tiny_config(n, num_nextn_predict_layers=mtp, index_topk_freq=freq,
                                  index_skip_topk_offset=offset))
    return cfg, run_check(cfg, PipelineSpec(split=sizes, vpp=vpp, mtp_layers=mtp), "hf")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), s=export_settings())
def test_every_exported_flag_is_a_megatron_option(plan, s):
    _, check = checked(*plan)
    if not check.megatron_flags:
        return
    unknown = [f for f in flags(megatron_argv(check, s)) if f not in OPTIONS]
    assert unknown == []
    unknown = [f for f in flags(slime_argv(check, s)) if f not in OPTIONS | SLIME_OWN]
    assert unknown == []
    # and Megatron's parser reads every value as the plan meant it
    ns = parses(megatron_argv(check, s))
    assert ns.tensor_model_parallel_size == s.tp and ns.context_parallel_size == s.cp
    assert ns.recompute_granularity == (None if s.recompute == "none" else s.recompute)
    assert ns.recompute_method == (s.recompute_method if s.recompute != "none" else None)
    assert ns.recompute_modules == (list(s.recompute_modules) if s.recompute == "selective" and s.recompute_modules
                                    else None)
    assert ns.hierarchical_context_parallel_sizes == (list(s.hierarchical_context_parallel_sizes)
                                                      if s.hierarchical_context_parallel_sizes else None)
    assert ns.cp_comm_type == ([s.cp_comm_type] if s.cp > 1 or s.cp_comm_type != "p2p" else None)
    assert ns.max_position_embeddings == s.max_position_embeddings and ns.seq_length == s.seq_length
    parses(slime_argv(check, s), SLIME_OWN)


def test_cp_allgather_and_dsa_spellings_differ_between_megatron_and_slime():
    check = run_check(load_model("glm-5.2"), PipelineSpec(pp=8, first=14, last=16))
    s = ExportSettings(tp=4, cp=8, ep=32, etp=1, sp=True, cp_comm_type="allgather")
    meg = megatron_argv(check, s)
    assert meg[meg.index("--cp-comm-type") + 1] == "allgather" and "--allgather-cp" not in meg
    assert meg[meg.index("--dsa-indexer-topk-freq") + 1] == "4"
    assert meg[meg.index("--dsa-indexer-skip-topk-offset") + 1] == "3"
    slime = slime_argv(check, s)
    assert "--allgather-cp" in slime and "--cp-comm-type" not in slime
    assert not [a for a in slime if a.startswith("--dsa-indexer")]
    # the plan builds the config's one MTP layer, so --mtp-num-layers 1 is emitted ...
    assert meg[meg.index("--mtp-num-layers") + 1] == "1"
    # ... and a plan without MTP emits no --mtp-num-layers at all
    none = run_check(load_model("glm-5.2"), PipelineSpec(pp=8, first=14, last=16, mtp_layers=0))
    assert "--mtp-num-layers" not in megatron_argv(none, s)


def test_refused_plan_has_no_export():
    check = run_check(load_model("glm-5.2"), PipelineSpec(pp=8, first=14, last=15))
    assert megatron_argv(check) == [] and slime_perf_args(check) == "" and exports(check) == {}


def _round_trip(script: str, cfg, n):
    parsed = parse_launcher(script)
    req = launcher_request(parsed, cfg)
    assert not req.unresolved and not req.errors, (req.unresolved, req.errors)
    return materialise(req.spec, n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), s=export_settings())
def test_megatron_and_slime_exports_parse_back_to_the_same_stages(plan, s):
    cfg, check = checked(*plan)
    event(f"exported: {bool(check.megatron_flags)}, layout: {'--pipeline-model-parallel-layout' in check.megatron_flags}")
    if not check.megatron_flags:
        return
    n = plan[3]
    script = f"torchrun pretrain_gpt.py \\\n    {megatron_text(check, s)}\n"
    again = _round_trip(script, cfg, n)
    assert not again.errors and stage_tuple(again) == stage_tuple(check.plan)
    script = f"{slime_perf_args(check, s)}\npython3 train.py \"${{PERF_ARGS[@]}}\"\n"
    again = _round_trip(script, cfg, n)
    assert not again.errors and stage_tuple(again) == stage_tuple(check.plan)


HOSTILE = ["$(touch {m})", "`touch {m}`", "x; touch {m}", "a'b\"c $(touch {m})", "--x\n touch {m}",
           "*", "$HOME", "-n", ""]


def _bash_words(text: str, tmp_path: Path) -> list[str]:
    """What bash makes of ``text`` as the arguments of a command (printf prints one word a line)."""
    out = subprocess.run([BASH, "-c", f"printf '%s\\0' {text}"], capture_output=True, cwd=tmp_path,
                         check=True, timeout=10)
    return out.stdout.decode().split("\0")[:-1]


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize("hostile", HOSTILE)
def test_exports_are_inert_in_real_bash(hostile, tmp_path):
    marker = tmp_path / "MARKER"
    value = hostile.format(m=marker)
    check = run_check(load_model("glm-5.2"), PipelineSpec(pp=8, first=14, last=16))
    s = ExportSettings(tp=4, cp=8, ep=32, recompute="full", recompute_method=value)
    texts = {"megatron": megatron_text(check, s), "slime": slime_perf_args(check, s),
             "cli": Plan(model=value, pp=8, first=14, last=16).cli_command(), "join": shell_join([value, "--layout", check.layout_string])}
    for name, text in texts.items():
        assert subprocess.run([BASH, "-n"], check=False, input=text.encode(), timeout=10).returncode == 0, name
    # the words bash sees are exactly the argv that was exported
    assert _bash_words(texts["megatron"].replace("\\\n", " "), tmp_path) == megatron_argv(check, s)
    assert _bash_words(texts["cli"], tmp_path)[2] == value
    script = texts["slime"] + "\nprintf '%s\\0' \"${PERF_ARGS[@]}\"\n"
    out = subprocess.run([BASH, "-c", script], capture_output=True, cwd=tmp_path, check=True, timeout=10)
    assert out.stdout.decode().split("\0")[:-1] == slime_argv(check, s)
    assert not marker.exists()


def test_settings_from_a_parallel_config_match_slimes_glm52_recipe():
    from app.core.engines.slime import SLIME_GLM52_PROFILE
    from app.core.evaluate import evaluate

    # the pinned profile the presets open, exported the way the slime engine exports it
    ev = evaluate(SLIME_GLM52_PROFILE, load_model("glm-5.2"))
    argv = slime_argv(ev.check, ExportSettings.from_plan(SLIME_GLM52_PROFILE, ev.par))
    # THUDM/slime scripts/run-glm5.2-744B-A40B.sh PERF_ARGS / OPTIMIZER_ARGS values
    for flag, value in (("--tensor-model-parallel-size", "4"), ("--context-parallel-size", "8"),
                        ("--expert-model-parallel-size", "32"), ("--expert-tensor-parallel-size", "1"),
                        ("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                        ("--recompute-num-layers", "1"), ("--max-tokens-per-gpu", "8192"),
                        ("--decoder-first-pipeline-num-layers", "14"), ("--decoder-last-pipeline-num-layers", "16")):
        assert argv[argv.index(flag) + 1] == value, flag
    for switch in ("--sequence-parallel", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                   "--use-precision-aware-optimizer", "--use-dynamic-batch-size", "--allgather-cp"):
        assert switch in argv
