"""Launcher import as a release gate: sourced files, model flags, fail-closed input, argparse's
last-occurrence rule on the final command line, provenance, and never executing anything.

The fixtures have the shape of THUDM/slime's launchers (scripts/run-glm5.2-744B-A40B.sh sources
scripts/models/glm5.2-744B-A40B.sh through the SCRIPT_DIR idiom; MODEL_ARGS / PERF_ARGS arrays
expanded on the ``ray job submit ... -- python3 train.py`` line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.core.engines.megatron.check import run_check
from app.core.launcher import (
    LauncherError,
    candidate_config,
    launcher_request,
    parse_launcher,
    read_launcher,
    read_launcher_files,
)
from app.core.model.config import load_model

MODEL_SH = """\
# GLM-5.2 model file (sourced)
NHIDDEN=6144
N_DENSE_LAYERS=3
N_MOE_LAYERS=75
MOE_FFN_HIDDEN=${MOE_FFN_HIDDEN:-2048}
MODEL_ARGS=(
    --num-layers $((N_DENSE_LAYERS + N_MOE_LAYERS))
    --hidden-size $NHIDDEN
    --num-attention-heads 64
    --num-experts 256
    --moe-ffn-hidden-size $MOE_FFN_HIDDEN
)
"""

RUN_SH = """\
#!/bin/bash
set -ex
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/glm5.2-744B-A40B.sh"

NNODES=${NNODES:-32}
PP=${PP:-8}
printf -v CKPT "%s/GLM-%s" "/root" "5.2"
for node in 1 2 3; do
   echo "node $node"
done

CKPT_ARGS=(
   --hf-checkpoint ${CKPT}
   --load ${CKPT}_torch_dist/
)
PERF_ARGS=(
   --tensor-model-parallel-size 4
   --sequence-parallel
   --pipeline-model-parallel-size ${PP}
   --decoder-first-pipeline-num-layers 14
   --decoder-last-pipeline-num-layers 16
   --context-parallel-size $(( NNODES / 4 ))
   --expert-model-parallel-size $(( NNODES ))
   --expert-tensor-parallel-size 1
)
ray job submit --address="http://127.0.0.1:8265" \\
   -- python3 train.py \\
   --actor-num-nodes ${NNODES} \\
   ${MODEL_ARGS[@]} \\
   ${CKPT_ARGS[@]} \\
   ${PERF_ARGS[@]}
"""


def write_tree(root: Path, run: str = RUN_SH, model: str | None = MODEL_SH) -> Path:
    (root / "scripts/models").mkdir(parents=True)
    if model is not None:
        (root / "scripts/models/glm5.2-744B-A40B.sh").write_text(model)
    script = root / "scripts/run-glm5.2-744B-A40B.sh"
    script.write_text(run)
    return script


def test_slime_shaped_launcher_with_a_sourced_model_file(tmp_path):
    script = write_tree(tmp_path)
    p = read_launcher(script)
    model_file = str(tmp_path / "scripts/models/glm5.2-744B-A40B.sh")
    assert p.files == (str(script), model_file)
    # 3 + 75 = 78; ${MOE_FFN_HIDDEN:-2048}; 32 / 4 = 8; printf -v builds /root/GLM-5.2
    assert p.values["--num-layers"] == "78" and p.values["--moe-ffn-hidden-size"] == "2048"
    assert p.values["--context-parallel-size"] == "8" and p.values["--expert-model-parallel-size"] == "32"
    assert p.values["--hf-checkpoint"] == "/root/GLM-5.2"
    assert p.values["--load"] == "/root/GLM-5.2_torch_dist/"
    prov = p.provenance()
    assert prov["--num-layers"] == {"value": "78", "file": model_file, "line": 7}
    assert prov["--pipeline-model-parallel-size"] == {"value": "8", "file": str(script), "line": 20}
    assert prov["--sequence-parallel"]["value"] is True
    assert p.trainer == (str(script), 27)
    # the model matches glm-5.2, the stages are slime's training split, and no MTP is built
    cfg = load_model("glm-5.2")
    req = launcher_request(p, cfg)
    assert req.errors == () and req.unresolved == ()
    assert req.spec.mtp_layers == 0
    assert any("builds no MTP layer" in w for w in req.warnings)
    assert not any("assuming the config" in w for w in req.warnings)
    assert req.report["values"]["--num-layers"]["file"] == model_file
    result = run_check(cfg, req.spec, "slime", extra_errors=req.errors)
    assert result.valid and result.plan.sizes == [14, 8, 8, 8, 8, 8, 8, 16] and result.plan.mtp_layers == 0


def test_pasted_files_are_matched_by_relative_path_or_base_name():
    files = {"run-glm5.2-744B-A40B.sh": RUN_SH, "models/glm5.2-744B-A40B.sh": MODEL_SH}
    p = read_launcher_files(files, "run-glm5.2-744B-A40B.sh")
    assert p.values["--num-layers"] == "78"
    assert p.provenance()["--hidden-size"]["file"] == "models/glm5.2-744B-A40B.sh"
    p = read_launcher_files({"run.sh": RUN_SH, "glm5.2-744B-A40B.sh": MODEL_SH}, "run.sh")
    assert p.values["--hidden-size"] == "6144"


def test_a_missing_sourced_file_is_named_and_is_not_a_verdict(tmp_path):
    script = write_tree(tmp_path, model=None)
    with pytest.raises(LauncherError) as exc:
        read_launcher(script)
    missing = str(tmp_path / "scripts/models/glm5.2-744B-A40B.sh")
    assert exc.value.missing and exc.value.missing[0].startswith(missing)
    assert missing in str(exc.value)
    with pytest.raises(LauncherError) as exc:
        read_launcher_files({"run.sh": RUN_SH}, "run.sh")
    assert "models/glm5.2-744B-A40B.sh" in exc.value.missing[0]


def test_sourcing_recurses_with_a_depth_limit(tmp_path):
    (tmp_path / "a.sh").write_text('source "$(dirname "$0")/b.sh"\n')
    (tmp_path / "b.sh").write_text("TP=2\n")
    (tmp_path / "run.sh").write_text('. "$(dirname "$0")/a.sh"\npython train.py --tensor-model-parallel-size $TP\n')
    assert read_launcher(tmp_path / "run.sh").values["--tensor-model-parallel-size"] == "2"
    (tmp_path / "loop.sh").write_text('source "$(dirname "$0")/loop.sh"\npython train.py\n')
    with pytest.raises(LauncherError, match="nests deeper than 8"):
        read_launcher(tmp_path / "loop.sh")


@pytest.mark.parametrize(("flag", "value", "attr"), [
    ("--num-layers", "61", "num_hidden_layers 78"), ("--hidden-size", "7168", "hidden_size 6144"),
    ("--num-attention-heads", "128", "num_attention_heads 64"), ("--num-experts", "160", "n_routed_experts 256"),
    ("--moe-ffn-hidden-size", "1536", "moe_intermediate_size 2048"),
    ("--dsa-indexer-topk-freq", "2", "index_topk_freq 4"), ("--dsa-indexer-skip-topk-offset", "1", "index_skip_topk_offset 3"),
    ("--mtp-num-layers", "3", "num_nextn_predict_layers 1"),
])
def test_every_model_disagreement_is_a_model_error_naming_file_line_and_both_values(tmp_path, flag, value, attr):
    run = RUN_SH.replace("   ${PERF_ARGS[@]}\n", f"   ${{PERF_ARGS[@]}} \\\n   {flag} {value}\n")
    script = write_tree(tmp_path, run=run)
    req = launcher_request(read_launcher(script), load_model("glm-5.2"))
    (err,) = req.errors
    assert err.kind == "model" and err.flag == flag
    assert err.message.startswith(f"{script}:33: {flag} {value}") and attr in err.message


def test_last_occurrence_on_the_final_command_line_wins_like_argparse():
    # PERF_ARGS is written first (TP 8) but expanded last, so argparse keeps its TP 8
    script = """\
PERF_ARGS=(--tensor-model-parallel-size 8)
EXTRA=(--tensor-model-parallel-size 2)
python3 train.py ${EXTRA[@]} "${PERF_ARGS[@]}"
"""
    p = parse_launcher(script, strict=True)
    assert p.values["--tensor-model-parallel-size"] == "8"
    assert p.provenance()["--tensor-model-parallel-size"]["line"] == 1
    assert any("set twice: 2 (line 2) and 8 (line 1)" in w for w in p.warnings)


@pytest.mark.parametrize(("text", "words"), [
    ("", "is empty"), ("   \n\n", "is empty"),
    (b"\x7fELF\x02\x01\x00\x00binary", "binary"),
    (b"\xff\xfe\xfa not utf-8", "not UTF-8"),
    ("TP=4\necho $TP\n", "no trainer invocation"),
    ('echo "now run python3 train.py --tensor-model-parallel-size 4"\n', "no trainer invocation"),
    ("echo python3 train.py --tensor-model-parallel-size 4\n", "no trainer invocation"),
    ('python train.py --tensor-model-parallel-size "4\n', "unterminated"),
    ("python train.py --pipeline-model-parallel-size 0\n", "--pipeline-model-parallel-size is 0 at line 1"),
    ("TP=$((2-2))\npython train.py --tensor-model-parallel-size $TP\n", "--tensor-model-parallel-size is 0"),
    ("A=(" + " x" * 5000 + ")\n" + 'B=("${A[@]}")\n' * 200 + "python train.py\n", "too complex"),
])
def test_unreadable_launchers_fail_closed(text, words):
    with pytest.raises(LauncherError, match=words):
        parse_launcher(text, strict=True)


@pytest.mark.parametrize("script", [
    # NVIDIA/Megatron-LM examples/academic_paper_scripts/detxoify_lm/annotations/preprocess.sh (d98e8a64), in shape
    "python3 tools/preprocess_data.py --input x.jsonl --output-prefix x --tokenizer-type GPT2BPETokenizer --workers 8\n",
    # examples/multimodal/combine_lm_vision_checkpoints.sh, in shape: a checkpoint merge, no model flag
    "python examples/multimodal/combine_state_dicts.py --input a b --prefixes language_model vision_model --output c\n",
    "python3 eval.py --task mmlu\n",
])
def test_a_python_command_that_is_no_training_run_is_refused(script):
    """Neither a known training entry point nor any plan flag: nothing says what would be trained, so
    no verdict (before, each became the default plan's verdict)."""
    from app.core.launcher import import_launcher
    from app.core.launcher.importer import LauncherImportError
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    with pytest.raises(LauncherImportError, match=r"is not a training entry point isplan knows .* sets none of"):
        import_launcher(script, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    # an unknown entry point that sets a plan flag is read (a wrapper of Megatron's pretrain), saying
    # that what it reads otherwise (Megatron-Bridge's MIMO examples take their TP from environment
    # variables) is not seen; a known entry point is read without that
    custom = "torchrun --nproc-per-node 8 my_trainer.py --tensor-model-parallel-size 4\n"
    got = import_launcher(custom, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    assert got.plan.tp == 4
    assert any(w.startswith("my_trainer.py (line 1) is not a training entry point isplan knows")
               and "is not seen" in w for w in got.warnings), got.warnings
    known = "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 4\n"
    assert not any("entry point" in w for w in import_launcher(known, load_preset("glm-5.2"),
                                                                Plan(model="glm-5.2")).warnings)


def test_two_different_training_runs_in_one_script_are_refused():
    """Bash runs both commands (or one branch of an ``if``): their flags would mix into a plan no run
    uses. The same launch twice (Megatron-LM ``examples/mimo/scripts/run_vlm_train.sh``'s debug and
    normal branches) is one; a helper command setting no plan flag does not count."""
    from app.core.launcher import import_launcher
    from app.core.launcher.importer import LauncherImportError
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    glm = load_preset("glm-5.2")
    two = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2\n"
           "torchrun pretrain_gpt.py --tensor-model-parallel-size 4\n")
    with pytest.raises(LauncherImportError, match=r"2 training commands \(line 1 \(pretrain_gpt.py\), line 2"):
        import_launcher(two, glm, Plan(model="glm-5.2"))
    branches = ("A=(--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2)\n"
                "if [ \"$DEBUG\" = 1 ]; then\n  debugpy-run -m torch.distributed.run -- pretrain_gpt.py ${A[@]}\n"
                "else\n  torchrun pretrain_gpt.py ${A[@]}\nfi\n")
    plan = import_launcher(branches, glm, Plan(model="glm-5.2")).plan
    assert (plan.tp, plan.pp) == (4, 2)
    helper = ("python tools/checkpoint/convert.py --input a --output b\n"
              "torchrun pretrain_gpt.py --tensor-model-parallel-size 8\n")
    assert import_launcher(helper, glm, Plan(model="glm-5.2")).plan.tp == 8


@pytest.mark.parametrize(("flags", "refused"), [
    ("--yaml-cfg cfg.yaml", "--yaml-cfg (line 1): Megatron replaces every command-line argument"),
    ("--use-checkpoint-args --use-mp-args-from-checkpoint-args",
     "--use-mp-args-from-checkpoint-args (line 1): with --use-checkpoint-args Megatron takes TP, PP, VPP and EP"),
    ("--use-mp-args-from-checkpoint-args", None),   # without --use-checkpoint-args it changes nothing
    ("--use-checkpoint-args", None),                # the shape from the checkpoint: a warning
])
def test_a_launch_whose_arguments_come_from_elsewhere_is_refused(flags, refused):
    """Megatron-LM @ d98e8a64: ``--yaml-cfg`` replaces the whole namespace with its file's
    (``parse_args``); ``--use-mp-args-from-checkpoint-args`` with ``--use-checkpoint-args`` forces the
    parallel sizes from the checkpoint (``load_args_from_checkpoint``): the command line does not say
    what would run, so no verdict; ``--use-checkpoint-args`` alone takes the model's shape from the
    checkpoint, said (the verdict compares the config given)."""
    from app.core.launcher import import_launcher
    from app.core.launcher.importer import LauncherImportError
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    script = f"torchrun pretrain_gpt.py --tensor-model-parallel-size 2 {flags}\n"
    if refused:
        with pytest.raises(LauncherImportError, match=re.escape(refused)):
            import_launcher(script, load_preset("glm-5.2"), Plan(model="glm-5.2"))
        return
    got = import_launcher(script, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    assert got.plan.tp == 2
    assert any(w.startswith("--use-checkpoint-args") for w in got.warnings) == ("--use-checkpoint-args" in flags)


def test_dev_null_and_a_directory_fail_closed(tmp_path):
    with pytest.raises(LauncherError, match="empty"):
        read_launcher("/dev/null")
    with pytest.raises(LauncherError, match="cannot read"):
        read_launcher(tmp_path)


def test_candidate_config_at_the_checkpoint_path(tmp_path):
    ckpt = tmp_path / "GLM-5.2"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    p = parse_launcher(f"python3 train.py --hf-checkpoint {ckpt} --load /nowhere\n", strict=True)
    assert candidate_config(p) == str(ckpt / "config.json")
    p = parse_launcher("python3 train.py --load GLM-5.2\n", strict=True)
    assert candidate_config(p, base=tmp_path) == str(ckpt / "config.json")
    assert candidate_config(parse_launcher("python3 train.py --load /nowhere\n")) is None


@pytest.mark.parametrize("payload", [
    "$(touch {m})", "`touch {m}`", "; touch {m}", "$(eval 'touch {m}')", "\"$(touch {m})\"",
])
def test_nothing_is_ever_executed(tmp_path, payload):
    marker = tmp_path / "MARKER"
    body = payload.format(m=marker)
    model = MODEL_SH + f"X={body}\neval \"touch {marker}\"\n"
    run = RUN_SH.replace("NNODES=${NNODES:-32}", f"NNODES=${{NNODES:-32}}\nY={body}\nsource <(touch {marker})")
    script = write_tree(tmp_path, run=run, model=model)
    with pytest.raises(LauncherError):   # the process substitution cannot be read: fail closed
        read_launcher(script)
    parse_launcher(run.replace(f"source <(touch {marker})", "") + f"python3 train.py --load {body}\n")
    assert not marker.exists()


def test_overlap_switches_follow_megatrons_parser():
    cfg = load_model("glm-5.2")
    req = launcher_request(parse_launcher("python3 train.py --overlap-p2p-communication\n", strict=True), cfg)
    assert req.spec.overlap_p2p is True
    assert any("not a Megatron option" in w and "--no-overlap-p2p-communication" in w for w in req.warnings)
    req = launcher_request(parse_launcher("python3 train.py --no-overlap-p2p-communication\n", strict=True), cfg)
    assert req.spec.overlap_p2p is False


def test_sourcing_the_same_big_file_again_and_again_is_bounded():
    import time

    big = "# padding\n" * 60_000 + "TP=2\n"          # ~600 kB
    run = "source big.sh\n" * 10 + "python3 train.py --tensor-model-parallel-size $TP\n"
    start = time.monotonic()
    with pytest.raises(LauncherError, match="add up to more than"):
        read_launcher_files({"run.sh": run, "big.sh": big}, "run.sh")
    assert time.monotonic() - start < 10


def test_a_setting_the_step_time_does_not_follow_is_named_where_the_script_sets_it():
    """A launcher's ``--accumulate-allreduce-grads-in-fp32`` changes how fast a step runs but no plan
    field carries it: the import names it with its file:line and the assumption the time keeps (the
    time's own ``defaults``), instead of answering as if the script had not set it;
    ``--moe-token-dispatcher-type``, ``--overlap-moe-expert-parallel-comm`` and ``--cuda-graph-impl``
    are plan settings and become the plan's; a script without them gets no such warning."""
    from app.core.engines.megatron.timing import UNSTATED_DEFAULTS, UNTIMED_FLAGS
    from app.core.launcher import import_launcher
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    base = ("torchrun pretrain_gpt.py --num-layers 48 --hidden-size 2048 --pipeline-model-parallel-size 2 \\\n"
            "  --expert-model-parallel-size 8 --seq-length 4096")
    script = (base + " \\\n  --moe-token-dispatcher-type alltoall --overlap-moe-expert-parallel-comm \\\n"
              "  --cuda-graph-impl full_iteration --accumulate-allreduce-grads-in-fp32\n")
    cfg = load_preset("qwen3-30b-a3b")
    got = import_launcher(script, cfg, Plan(model=cfg.id))
    untimed = [w for w in got.warnings if "is not a plan setting" in w]
    expected = {"--accumulate-allreduce-grads-in-fp32": ("grad_reduce_in_fp32", 4)}
    assert len(untimed) == len(expected)
    for given, (setting, line) in expected.items():
        (w,) = [w for w in untimed if w.startswith(f"{given} (line {line}) ")]
        assert w.endswith("assumes " + UNSTATED_DEFAULTS[setting])
    assert got.report["warnings"] == list(got.warnings)
    assert got.report["values"]["--cuda-graph-impl"]["value"] == "full_iteration"
    assert (got.plan.moe_token_dispatcher_type, got.plan.overlap_moe_expert_parallel_comm,
            got.plan.cuda_graph_impl) == ("alltoall", True, "full_iteration")
    assert {f for f, _, _ in UNTIMED_FLAGS} >= {f.split()[0] for f in expected}
    assert not [w for w in import_launcher(base + "\n", cfg, Plan(model=cfg.id)).warnings if "plan setting" in w]


def test_trainer_flags_the_parser_lacks_or_memory_does_not_follow_are_named():
    """On the trainer's line (after its ``.py``, words spliced from an array included): a flag that is
    not in Megatron-LM's option list (``app/core/data/megatron_arguments.txt`` @ d98e8a64; its argparse
    stops on it) and a memory setting no plan field carries (``--use-torch-fsdp2``,
    ``--num-distributed-optimizer-instances`` ...) are each a warning with file:line and, for a value,
    the value given; torchrun's own flags (before the ``.py``) and the flags the reader reads (the
    optimizer dtypes are plan settings) are not. A slime launch (its parser adds slime's own
    arguments, whose list isplan does not hold) gets the memory warnings only."""
    from app.core.launcher import import_launcher
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    cfg = load_preset("glm-5.2")
    script = ("EXTRA=(--num-distributed-optimizer-instances 2 --no-such-option 3)\n"              # 1
              "torchrun --nproc-per-node 8 --rdzv-backend c10d pretrain_gpt.py \\\n"              # 2
              "  --pipeline-model-parallel-size 8 --tensor-model-parallel-size 4 \\\n"           # 3
              "  --main-grads-dtype=bf16 --use-torch-fsdp2 --log-interval 1 \"${EXTRA[@]}\"\n")  # 4
    got = import_launcher(script, cfg, Plan(model=cfg.id))
    named = [w.split(" (line")[0] for w in got.warnings if "(line" in w and ("not a plan setting" in w
                                                                           or "option" in w)]
    assert named == ["--use-torch-fsdp2", "--num-distributed-optimizer-instances 2", "--no-such-option"]
    assert got.plan.main_grads_dtype == "bf16"   # a plan setting: the memory follows it
    (unknown,) = [w for w in got.warnings if w.startswith("--no-such-option")]
    assert "(line 4)" in unknown and "is not a Megatron-LM option" in unknown and "unrecognized arguments" in unknown
    slime = ("PERF_ARGS=(--pipeline-model-parallel-size 8 --use-megatron-fsdp --slime-only-thing 1)\n"
             "python3 train.py --actor-num-nodes 32 --actor-num-gpus-per-node 8 \"${PERF_ARGS[@]}\"\n")
    sw = import_launcher(slime, cfg, Plan(model=cfg.id)).warnings
    assert [w.split(" (line")[0] for w in sw if "not a plan setting" in w] == ["--use-megatron-fsdp"]
    assert not [w for w in sw if "option" in w and "slime-only-thing" in w]


@pytest.mark.parametrize(("flags", "expected"), [
    ("--bf16", None),
    ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather", "fp8"),
    ("--bf16 --fp8-format=e4m3 --fp8-recipe=mxfp8", "mxfp8"),
    ("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4 --fp4-param-gather", "nvfp4"),
    ("--bf16 --fp4-format e2m1", "nvfp4"),            # fp4_recipe defaults to nvfp4 (transformer_config.py:679)
    ("--bf16 --fp8-format hybrid", "delayed"),         # fp8_recipe defaults to delayed (:594): not modelled
    ("--bf16 --fp8-format e4m3 --fp8-recipe blockwise", "blockwise"),
])
def test_a_launchers_precision_flags_become_the_plans_precision(flags, expected):
    """Megatron's --fp8-format / --fp8-recipe / --fp4-format / --fp4-recipe are the plan's precision as
    the export writes them (app/core/time/precision.py presets: fp8 = hybrid + tensorwise, mxfp8 = e4m3 +
    mxfp8, nvfp4 = e2m1 + nvfp4); a recipe isplan does not time (delayed, blockwise) keeps BF16 and says
    so with file:line; the precision flags are never reported as unknown or unread."""
    from app.core.launcher import import_launcher
    from app.core.model.config import load_preset
    from app.core.plan import Plan

    cfg = load_preset("glm-5.2")
    got = import_launcher(f"torchrun pretrain_gpt.py --pipeline-model-parallel-size 8 --use-distributed-optimizer "
                          f"{flags}\n", cfg, Plan(model=cfg.id))
    named = [w for w in got.warnings if "precision" in w or "not a plan setting" in w or "option" in w]
    if expected in (None, "fp8", "mxfp8", "nvfp4"):
        assert got.plan.precision == (expected or "bf16") and not named
    else:
        assert got.plan.precision == "bf16"
        (w,) = named
        assert f"--fp8-recipe {expected}" in w and "not one of isplan's precisions" in w and w.endswith("(line 1)")


@pytest.mark.parametrize("precision", ["bf16", "fp8", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("distributed", [True, False])
def test_an_exported_precision_imports_back(precision, distributed):
    """Differential: the Megatron arguments the export writes for a precision (with or without the
    distributed optimizer, which drops the parameter-gather flag) import back to that precision."""
    from app.core.engines.megatron.export import shell_join
    from app.core.launcher import import_launcher
    from app.core.model.config import load_preset
    from app.core.plan import Plan
    from app.core.time.precision import megatron_flags

    cfg = load_preset("glm-5.2")
    argv = ["torchrun", "pretrain_gpt.py", "--pipeline-model-parallel-size", "8",
            *(["--use-distributed-optimizer"] if distributed else []),
            *megatron_flags(precision, distributed_optimizer=distributed)]
    got = import_launcher(shell_join(argv) + "\n", cfg, Plan(model=cfg.id))
    assert got.plan.precision == precision


def test_optimizer_dtypes_are_plan_settings_the_memory_export_and_import_follow():
    """``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` (and the main-grads / main-params dtypes) are plan
    settings with Megatron's names: the memory follows them (with the precision-aware optimizer and
    BF16 params: a 16-bit master remainder 2 B + m 4 B + v 4 B = 10 B per sharded parameter, 2 + 2 + 2 =
    6 B with BF16 moments: 0.6 of it), the export writes them, and its launcher imports back to them."""
    from app.core.evaluate import evaluate
    from app.core.launcher import import_launcher
    from app.core.model.config import load_preset
    from app.core.plan import strict_plan

    cfg = load_preset("glm-5.2")
    q = {"model": "glm-5.2", "engine": "megatron", "split": "14,8,8,8,8,8,8,16", "tp": "4", "cp": "8", "ep": "32",
         "etp": "1", "sp": "1", "cp_comm_type": "allgather", "use_precision_aware_optimizer": "1"}
    base, low = (evaluate(strict_plan({**q, **extra}), cfg) for extra in
                 ({}, {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}))
    for key in ("optimizer_dense", "optimizer_expert"):
        a, b = (ev.memory["stages"][0]["breakdown_detail"][key] for ev in (base, low))
        assert abs(b / a - 0.6) < 1e-9, (key, a, b)
    argv = low.exports()["megatron"]
    assert "--exp-avg-dtype bf16" in argv.replace(" \\\n    ", " ") and "--main-grads-dtype" not in argv
    back = import_launcher("torchrun pretrain_gpt.py " + argv + "\n", cfg, strict_plan({"model": "glm-5.2"}))
    assert (back.plan.exp_avg_dtype, back.plan.exp_avg_sq_dtype, back.plan.main_grads_dtype) == ("bf16", "bf16", "fp32")
    assert not [w for w in back.warnings if "exp-avg" in w]
