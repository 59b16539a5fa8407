"""Tests for the reader of app.core.launcher (lexer, words, parameters, arithmetic, arrays, flags): static reading of bash launcher scripts (nothing is executed).

Every expected value below was worked out by hand from the script text, not copied from output.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.launcher import (
    KNOWN_SWITCH_FLAGS,
    KNOWN_VALUE_FLAGS,
    MAX_LAUNCHER_BYTES,
    FlagOccurrence,
    LauncherError,
    LauncherParse,
    UnresolvedValue,
)
from app.core.launcher import parse_launcher as _parse_launcher


def parse_launcher(text):
    """These tests exercise the lexer and interpreter on fragments, so the lenient mode: the
    fail-closed rules of a whole launcher are tested in tests/core/launcher/test_launcher_training.py."""
    return _parse_launcher(text, strict=False)

# A GLM-5.2 SFT launcher in the style of THUDM/slime scripts/run-glm5-744B-A40B-sft.sh.
# Line numbers matter: the first line of the string is line 1.
GLM52_SLIME = r"""#!/bin/bash
# GLM-5.2 (744B-A40B) SFT launcher, slime style.

# for rerun the task
pkill -9 sglang
sleep 3
ray stop --force
pkill -9 ray

set -ex

# will prevent ray from buffering stdout/stderr
export PYTHONBUFFERED=16

NVLINK_COUNT=$(nvidia-smi topo -m 2>/dev/null | grep -o 'NV[0-9][0-9]*' | wc -l)
if [ "$NVLINK_COUNT" -gt 0 ]; then
    HAS_NVLINK=1
else
    HAS_NVLINK=0
fi
echo "HAS_NVLINK: $HAS_NVLINK (detected $NVLINK_COUNT NVLink references)"

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"

NODES=32
N_DENSE_LAYERS=3
NUM_LAYERS=$(( 75 + N_DENSE_LAYERS ))
PP=$((NODES / 4))

MODEL_ARGS=(
   --num-layers ${NUM_LAYERS}
   --hidden-size 6144
   --dsa-indexer-topk-freq 4          # a full indexer every 4th layer
   --dsa-indexer-skip-topk-offset ${N_DENSE_LAYERS}
   --mtp-num-layers 1
)

CKPT_ARGS=(
   --hf-checkpoint /root/GLM-5.2
   --load /root/GLM-5.2_torch_dist/
   --save /root/GLM-5.2_slime/
)

SFT_ARGS=(
   --rollout-function-path slime.rollout.sft_rollout.generate_rollout
   --prompt-data /root/openhermes2_5.parquet
   --input-key messages
   --rollout-shuffle
   --num-epoch 3
   --rollout-batch-size 128
   --global-batch-size 128
   --loss-type sft_loss
   --calculate-per-token-loss
   --disable-compute-advantages-and-returns
   --debug-train-only
)

PERF_ARGS=(
   --tensor-model-parallel-size 4
   --sequence-parallel
   --pipeline-model-parallel-size ${PP}    # 8 stages
   --decoder-first-pipeline-num-layers 14
   --decoder-last-pipeline-num-layers 16
   --context-parallel-size 8
   --expert-model-parallel-size 32
   --expert-tensor-parallel-size 1

   # recompute everything, one layer at a time
   --recompute-granularity full
   --recompute-method uniform
   --recompute-num-layers 1

   --use-dynamic-batch-size
   --max-tokens-per-gpu 16384
   --optimizer-cpu-offload
   --overlap-cpu-optimizer-d2h-h2d
   --use-precision-aware-optimizer
)

OPTIMIZER_ARGS=(
   --optimizer adam
   --lr 1e-5
   --lr-decay-style cosine
   --weight-decay 0.1
   --adam-beta1 0.9
   --adam-beta2 0.95
)

MISC_ARGS=(
   --attention-dropout 0.0
   --hidden-dropout 0.0
   --accumulate-allreduce-grads-in-fp32
   --attention-softmax-in-fp32
   --attention-backend flash
)

# launch the master node of ray in container
export MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ray start --head --node-ip-address ${MASTER_ADDR} --num-gpus 8 --disable-usage-stats --dashboard-host=0.0.0.0 --dashboard-port=8265

RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"PYTHONPATH\": \"/root/Megatron-LM/\",
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\",
    \"NCCL_NVLS_ENABLE\": \"${HAS_NVLINK}\"
  }
}"

ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 train_async.py \
   --actor-num-nodes ${NODES} \
   --actor-num-gpus-per-node 8 \
   ${MODEL_ARGS[@]} \
   ${CKPT_ARGS[@]} \
   ${SFT_ARGS[@]} \
   ${OPTIMIZER_ARGS[@]} \
   ${PERF_ARGS[@]} \
   ${MISC_ARGS[@]} \
   --use-distributed-optimizer
"""

# A Megatron-LM torchrun launcher using --flag=value (and torchrun's underscore spelling).
MEGATRON_TORCHRUN = r"""#!/bin/bash
# Megatron-LM GPT pretraining
export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-4}
TP=2
PP_SIZE=4
CHECKPOINT_PATH=$1

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port 6000
)

GPT_MODEL_ARGS=(
    --num-layers=96
    --seq-length=2048
    "--micro-batch-size=1"
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size=$TP
    --pipeline-model-parallel-size=${PP_SIZE}
    --num-layers-per-virtual-pipeline-stage=$(( 96 / PP_SIZE / 4 ))
    --account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --global-batch-size=1536 --overlap-p2p-communication \
    --pipeline-model-parallel-layout='Et*3|(tt|)*29,m|L' \
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH 2>&1 | tee train.log
"""


def occ(parse: LauncherParse, flag: str) -> list[FlagOccurrence]:
    return [o for o in parse.occurrences if o.flag == flag]


def unresolved(parse: LauncherParse, flag: str) -> UnresolvedValue:
    (u,) = [u for u in parse.unresolved if u.flag == flag]
    return u


# --- realistic launchers ---------------------------------------------------------------------------

def test_glm52_slime_sft_script() -> None:
    p = parse_launcher(GLM52_SLIME)
    assert p.values == {
        "--num-layers": "78",
        "--hidden-size": "6144",
        "--hf-checkpoint": "/root/GLM-5.2",
        "--load": "/root/GLM-5.2_torch_dist/",
        "--dsa-indexer-topk-freq": "4",
        "--dsa-indexer-skip-topk-offset": "3",
        "--mtp-num-layers": "1",
        "--global-batch-size": "128",
        "--tensor-model-parallel-size": "4",
        "--pipeline-model-parallel-size": "8",
        "--decoder-first-pipeline-num-layers": "14",
        "--decoder-last-pipeline-num-layers": "16",
        "--context-parallel-size": "8",
        "--expert-model-parallel-size": "32",
        "--expert-tensor-parallel-size": "1",
        "--recompute-granularity": "full",
        "--recompute-method": "uniform",
        "--recompute-num-layers": "1",
        "--max-tokens-per-gpu": "16384",
        "--actor-num-nodes": "32",
        "--actor-num-gpus-per-node": "8",
    }
    assert p.switches == {
        "--sequence-parallel", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer", "--use-distributed-optimizer",
        "--accumulate-allreduce-grads-in-fp32",   # read to say the step time does not follow it
    }
    assert p.unresolved == ()
    assert p.warnings == ()
    # $(nvidia-smi ...) only feeds HAS_NVLINK's `if`, which is no flag of interest: silently ignored.
    assert "NVLINK_COUNT" not in p.variables
    # the SCRIPT_DIR idiom resolves to the launcher's own directory ("." for pasted text)
    assert p.variables["SCRIPT_DIR"] == "."
    assert p.variables["PP"] == "8"
    assert p.variables["NUM_LAYERS"] == "78"
    assert p.variables["N_DENSE_LAYERS"] == "3"
    assert p.variables["HAS_NVLINK"] == "0"          # text order: the else branch is written last
    assert p.variables["MASTER_ADDR"] == "127.0.0.1"
    assert occ(p, "--pipeline-model-parallel-size") == [
        FlagOccurrence("--pipeline-model-parallel-size", "8", 61, "${PP}")]
    assert occ(p, "--dsa-indexer-skip-topk-offset") == [
        FlagOccurrence("--dsa-indexer-skip-topk-offset", "3", 34, "${N_DENSE_LAYERS}")]
    assert occ(p, "--sequence-parallel") == [FlagOccurrence("--sequence-parallel", None, 60, "")]
    assert occ(p, "--actor-num-nodes") == [FlagOccurrence("--actor-num-nodes", "32", 112, "${NODES}")]
    assert occ(p, "--use-distributed-optimizer")[0].line == 120
    # Each flag is collected where it is written; ${PERF_ARGS[@]} does not count it again.
    assert [(o.flag, o.line) for o in p.occurrences] == [
        ("--num-layers", 31), ("--hidden-size", 32), ("--dsa-indexer-topk-freq", 33),
        ("--dsa-indexer-skip-topk-offset", 34), ("--mtp-num-layers", 35), ("--hf-checkpoint", 39),
        ("--load", 40), ("--global-batch-size", 51), ("--tensor-model-parallel-size", 59),
        ("--sequence-parallel", 60), ("--pipeline-model-parallel-size", 61),
        ("--decoder-first-pipeline-num-layers", 62), ("--decoder-last-pipeline-num-layers", 63),
        ("--context-parallel-size", 64), ("--expert-model-parallel-size", 65),
        ("--expert-tensor-parallel-size", 66), ("--recompute-granularity", 69),
        ("--recompute-method", 70), ("--recompute-num-layers", 71), ("--max-tokens-per-gpu", 74),
        ("--optimizer-cpu-offload", 75), ("--overlap-cpu-optimizer-d2h-h2d", 76),
        ("--use-precision-aware-optimizer", 77), ("--accumulate-allreduce-grads-in-fp32", 92), ("--actor-num-nodes", 112),
        ("--actor-num-gpus-per-node", 113), ("--use-distributed-optimizer", 120),
    ]
    assert p.int_value("--pipeline-model-parallel-size") == 8
    assert p.int_value("--seq-length") is None


def test_megatron_torchrun_flag_equals_value() -> None:
    p = parse_launcher(MEGATRON_TORCHRUN)
    assert p.values == {
        "--nproc-per-node": "8",
        "--nnodes": "4",
        "--num-layers": "96",
        "--seq-length": "2048",
        "--micro-batch-size": "1",
        "--tensor-model-parallel-size": "2",
        "--pipeline-model-parallel-size": "4",
        "--num-layers-per-virtual-pipeline-stage": "6",
        "--global-batch-size": "1536",
        "--pipeline-model-parallel-layout": "Et*3|(tt|)*29,m|L",
    }
    assert p.switches == {
        "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
        "--overlap-p2p-communication",
    }
    # $MASTER_ADDR only feeds a flag we do not read; $1 ($CHECKPOINT_PATH) feeds --load and --save,
    # and --load (the checkpoint path, read to find the model) cannot be known
    assert [(u.flag, u.line) for u in p.unresolved] == [("--load", 37)]
    assert occ(p, "--tensor-model-parallel-size") == [
        FlagOccurrence("--tensor-model-parallel-size", "2", 25, "$TP")]
    assert occ(p, "--micro-batch-size") == [FlagOccurrence("--micro-batch-size", "1", 21, "1")]
    assert occ(p, "--nproc-per-node") == [FlagOccurrence("--nproc-per-node", "8", 12, "$GPUS_PER_NODE")]
    assert occ(p, "--pipeline-model-parallel-layout") == [FlagOccurrence(
        "--pipeline-model-parallel-layout", "Et*3|(tt|)*29,m|L", 36, "'Et*3|(tt|)*29,m|L'")]


def test_flags_in_a_double_quoted_string_variable() -> None:
    script = (
        'GPT_ARGS="--num-layers 24 \\\n'
        '    --seq-length $SEQ \\\n'
        '    --sequence-parallel"\n'
        "torchrun pretrain_gpt.py $GPT_ARGS\n"
    )
    p = parse_launcher(script)
    assert p.values == {"--num-layers": "24"}
    assert p.switches == {"--sequence-parallel"}
    assert [(o.flag, o.line) for o in p.occurrences] == [
        ("--num-layers", 1), ("--seq-length", 2), ("--sequence-parallel", 3)]
    assert unresolved(p, "--seq-length") == UnresolvedValue(
        "--seq-length", "$SEQ", 2, "$SEQ is not assigned in this script")


def test_sourced_files_and_never_assigned_arrays_are_reported() -> None:
    script = (
        'source "$SCRIPT_DIR/models/glm5.sh"\n'
        'launch() { python3 train.py ${MODEL_ARGS[@]} "${PERF_ARGS[@]}"; }\n'
        "PERF_ARGS=(--sequence-parallel)   # assigned after the function: fine\n"
        "launch\n"
    )
    p = parse_launcher(script)
    assert p.switches == {"--sequence-parallel"}
    assert p.warnings == (
        'line 1: source "$SCRIPT_DIR/models/glm5.sh" is not read; anything it defines is unknown here',
        "line 2: ${MODEL_ARGS[@]} is never assigned in this script, so flags inside it are not seen",
    )


# --- unresolved values -----------------------------------------------------------------------------

def test_unresolved_environment_and_command_substitution() -> None:
    script = """TP=4
GPUS=$(nvidia-smi --list-gpus | wc -l)
python pretrain_gpt.py \\
  --tensor-model-parallel-size $TP \\
  --pipeline-model-parallel-size $PP \\
  --context-parallel-size ${CP} \\
  --nproc-per-node $GPUS \\
  --expert-model-parallel-size `nproc` \\
  --num-layers $((LAYERS * 2)) \\
  --save $SAVE_DIR \\
  --seq-length
"""
    p = parse_launcher(script)
    assert p.values == {"--tensor-model-parallel-size": "4"}
    assert [(u.flag, u.line) for u in p.unresolved] == [
        ("--pipeline-model-parallel-size", 5), ("--context-parallel-size", 6), ("--nproc-per-node", 7),
        ("--expert-model-parallel-size", 8), ("--num-layers", 9), ("--seq-length", 11),
    ]
    assert unresolved(p, "--pipeline-model-parallel-size") == UnresolvedValue(
        "--pipeline-model-parallel-size", "$PP", 5, "$PP is not assigned in this script")
    assert unresolved(p, "--context-parallel-size").reason == "$CP is not assigned in this script"
    gpus = unresolved(p, "--nproc-per-node")
    assert gpus.raw == "$GPUS"
    assert "command substitution $(nvidia-smi --list-gpus | wc -l) cannot be evaluated" in gpus.reason
    assert "$GPUS" in gpus.reason
    assert "command substitution" in unresolved(p, "--expert-model-parallel-size").reason
    assert unresolved(p, "--num-layers").reason == "$LAYERS is not assigned in this script"
    assert unresolved(p, "--seq-length").reason == "--seq-length has no value"
    # unresolved occurrences are recorded with value None
    assert occ(p, "--pipeline-model-parallel-size") == [
        FlagOccurrence("--pipeline-model-parallel-size", None, 5, "$PP")]
    # $SAVE_DIR only feeds --save, which is not of interest: not reported
    assert all(u.raw != "$SAVE_DIR" for u in p.unresolved)


def test_value_flag_followed_by_another_flag_has_no_value() -> None:
    p = parse_launcher("python t.py --pipeline-model-parallel-size --sequence-parallel --tensor-model-parallel-size=\n")
    assert p.values == {}
    assert p.switches == {"--sequence-parallel"}
    assert [(u.flag, u.reason) for u in p.unresolved] == [
        ("--pipeline-model-parallel-size", "--pipeline-model-parallel-size has no value"),
        ("--tensor-model-parallel-size", "--tensor-model-parallel-size has an empty value"),
    ]


def test_unresolved_last_occurrence_drops_earlier_value() -> None:
    p = parse_launcher("python a.py --pipeline-model-parallel-size 4\npython b.py --pipeline-model-parallel-size $PP\n")
    assert "--pipeline-model-parallel-size" not in p.values
    assert [(u.flag, u.line) for u in p.unresolved] == [("--pipeline-model-parallel-size", 2)]
    assert p.warnings == (
        ("--pipeline-model-parallel-size is set twice: 4 (line 1) and $PP (unresolved) (line 2); "
        "the last one cannot be resolved, so no value is used"),)


def test_positional_parameters_are_unknown_but_defaults_apply() -> None:
    p = parse_launcher('python t.py --num-layers $1 --seq-length "${2:-4096}"\n')
    assert p.values == {"--seq-length": "4096"}
    assert "positional" in unresolved(p, "--num-layers").reason


# --- quoting, layouts, pipes, comments -------------------------------------------------------------

@pytest.mark.parametrize("written", [
    '--pipeline-model-parallel-layout "Et*3|(tt|)*29,m|L"',
    "--pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'",
    '--pipeline-model-parallel-layout="Et*3|(tt|)*29,m|L"',
    '"--pipeline-model-parallel-layout=Et*3|(tt|)*29,m|L"',
    '--pipeline-model-parallel-layout "$LAYOUT"',
    "--pipeline-model-parallel-layout ${LAYOUT}",
])
def test_quoted_layout_string_keeps_pipes_stars_and_parens(written: str) -> None:
    script = f'LAYOUT="Et*3|(tt|)*29,m|L"\npython t.py --num-layers 92 {written}  # trailing comment\n'
    p = parse_launcher(script)
    assert p.values["--pipeline-model-parallel-layout"] == "Et*3|(tt|)*29,m|L"
    assert p.values["--num-layers"] == "92"
    assert p.unresolved == ()


def test_unquoted_pipe_splits_the_command_without_crashing() -> None:
    p = parse_launcher("python t.py --num-layers 8 --pipeline-model-parallel-layout Et|(tt|)*2 | tee log\n"
                       "echo done | grep --micro-batch-size 2\n")
    # bash passes only "Et" (the rest is a pipeline); we report what bash would pass
    assert p.values == {"--num-layers": "8", "--pipeline-model-parallel-layout": "Et", "--micro-batch-size": "2"}


def test_comments_and_hash_inside_quotes() -> None:
    script = """# --num-layers 1 in a comment does not count
A=5  # trailing comment
python t.py \\
  --num-layers $A \\
  --pipeline-model-parallel-layout "E#t|L" # --seq-length 9
echo $# ${#A} '#' "# --micro-batch-size 3"
"""
    p = parse_launcher(script)
    assert p.values == {"--num-layers": "5", "--pipeline-model-parallel-layout": "E#t|L"}
    assert occ(p, "--num-layers")[0].line == 4


def test_crlf_line_endings() -> None:
    p = parse_launcher("TP=2\r\npython t.py \\\r\n  --tensor-model-parallel-size $TP\r\n")
    assert p.values == {"--tensor-model-parallel-size": "2"}
    assert occ(p, "--tensor-model-parallel-size")[0].line == 3


# --- duplicates ------------------------------------------------------------------------------------

def test_duplicate_flag_with_different_values_warns_and_last_wins() -> None:
    script = """python a.py --pipeline-model-parallel-size 2
B=1
C=2
D=3
python b.py --pipeline-model-parallel-size 8
python c.py --tensor-model-parallel-size 4 --tensor-model-parallel-size 4
"""
    p = parse_launcher(script)
    assert p.values["--pipeline-model-parallel-size"] == "8"
    assert p.warnings == (
        "--pipeline-model-parallel-size is set twice: 2 (line 1) and 8 (line 5); the last one (8) is used",)
    assert len(occ(p, "--tensor-model-parallel-size")) == 2   # same value twice: no warning


def test_three_different_values() -> None:
    p = parse_launcher("X --seq-length 1\nX --seq-length 2\nX --seq-length 3\n")
    assert p.values == {"--seq-length": "3"}
    assert p.warnings == ("--seq-length is set 3 times: 1 (line 1), 2 (line 2), 3 (line 3); the last one (3) is used",)


# --- variables, defaults, arrays -------------------------------------------------------------------

def test_parameter_defaults() -> None:
    script = """CP_A=${UNSET_X:-8}
EMPTY=
CP_B=${EMPTY:-8}
CP_C=${EMPTY-8}
SET=2
CP_D=${SET:-8}
CP_E=${UNSET_Y-7}
CP_F=${UNSET_Z:=5}
CP_G=${SET:+on}
CP_H=${UNSET_W:+on}
python t.py --context-parallel-size ${CP:-8} --expert-model-parallel-size ${SET:-16}
"""
    p = parse_launcher(script)
    assert p.values == {"--context-parallel-size": "8", "--expert-model-parallel-size": "2"}
    v = p.variables
    assert (v["CP_A"], v["CP_B"], v["CP_C"], v["CP_D"], v["CP_E"]) == ("8", "8", "", "2", "7")
    assert (v["CP_F"], v["UNSET_Z"], v["CP_G"], v["CP_H"]) == ("5", "5", "on", "")


def test_assignment_forms_and_overrides() -> None:
    script = """export TP=1
readonly PP='2'
declare -i CP="3"
f() { local EP=4; }
TP=8
typeset -x ETP=1 VPP=2
SUFFIX=ab
SUFFIX+=cd
unset VPP
"""
    p = parse_launcher(script)
    assert p.variables == {"TP": "8", "PP": "2", "CP": "3", "EP": "4", "ETP": "1", "SUFFIX": "abcd"}


def test_arrays_append_splice_and_expansions() -> None:
    script = """ARGS=(--tensor-model-parallel-size 2)
ARGS+=(
  # a comment inside the array
  --pipeline-model-parallel-size 4
)
ALL=("${ARGS[@]}" --sequence-parallel)
FIRST=$ARGS
SECOND=${ALL[1]}
COUNT=${#ALL[@]}
JOINED="${ALL[*]}"
UNUSED=(--micro-batch-size 2)
"""
    p = parse_launcher(script)
    assert p.variables["FIRST"] == "--tensor-model-parallel-size"
    assert p.variables["SECOND"] == "2"
    assert p.variables["COUNT"] == "5"
    assert p.variables["JOINED"] == "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --sequence-parallel"
    # each flag counted once, where written; UNUSED is never expanded but still counts (documented)
    assert [(o.flag, o.line) for o in p.occurrences] == [
        ("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 4),
        ("--sequence-parallel", 6), ("--micro-batch-size", 11)]
    assert p.values == {"--tensor-model-parallel-size": "2", "--pipeline-model-parallel-size": "4",
                        "--micro-batch-size": "2"}


# --- arithmetic ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("expr", "expected"), [
    ("-7 / 2", "-3"),          # truncates toward zero
    ("7 / -2", "-3"),
    ("-7 % 2", "-1"),          # remainder takes the dividend's sign
    ("7 % 3", "1"),
    ("(2 + 3) * 4", "20"),
    ("2 + 3 * 4", "14"),
    ("10 - 2 - 3", "5"),
    ("100 / 10 / 5", "2"),
    ("- -3", "3"),
    ("010", "8"),              # leading zero: octal
    ("0x10", "16"),
    ("N * 2", "42"),
    ("$N + ${N}", "42"),
    ("EXPR * 2", "14"),        # EXPR holds "3+4", evaluated as arithmetic
    ("9223372036854775807 + 1", "-9223372036854775808"),   # 64-bit wrap
    ("", "0"),
])
def test_arithmetic(expr: str, expected: str) -> None:
    p = parse_launcher(f"N=21\nEXPR=3+4\nX=$(( {expr} ))\n")
    assert p.variables["X"] == expected


@pytest.mark.parametrize(("expr", "reason_part"), [
    ("1 / 0", "division by zero"),
    ("5 % (2 - 2)", "division by zero"),
    ("2 ** 3", "unsupported arithmetic"),
    ("08", "invalid number"),
    ("UNKNOWN + 1", "$UNKNOWN is not assigned in this script"),
    ("$(nproc) / 2", "command substitution"),
    ("1 +", "unsupported arithmetic"),
    ("1 2", "unsupported arithmetic"),
])
def test_arithmetic_unresolved(expr: str, reason_part: str) -> None:
    p = parse_launcher(f"X=$(( {expr} ))\npython t.py --num-layers $X\n")
    assert "X" not in p.variables
    assert "--num-layers" not in p.values
    assert reason_part in unresolved(p, "--num-layers").reason


def test_arithmetic_in_a_flag_value() -> None:
    p = parse_launcher("NODES=16\npython t.py --num-layers $(( -7 / 2 )) --pipeline-model-parallel-size=$((NODES / 4))\n")
    assert p.values == {"--num-layers": "-3", "--pipeline-model-parallel-size": "4"}
    assert occ(p, "--pipeline-model-parallel-size")[0].raw == "$((NODES / 4))"


# --- control flow ----------------------------------------------------------------------------------

def test_if_for_while_case_function_and_heredoc() -> None:
    script = """#!/bin/bash
set -euo pipefail
usage() {
    echo "usage: $0 [--dry-run]" >&2
    exit 1
}
function launch {
    python train.py --pipeline-model-parallel-size "${1:-4}" "$@"
}
if [[ "${1:-}" == "--dry-run" ]]; then
    DRY=1
elif [ -n "$X" ]; then DRY=2; fi
for i in $(seq 1 $NNODES); do
    echo "node $i"
done
while read -r host; do ssh "$host" nvidia-smi; done < hosts.txt
case "$MODE" in
    big) TP=8 ;;
    *) TP=4 ;;
esac
cat > config.txt <<EOF
--tensor-model-parallel-size 99
EOF
cat <<-'END'
	--seq-length 77
	END
(( count = 1 ))
launch --tensor-model-parallel-size $TP --sequence-parallel && echo ok || echo failed
"""
    p = parse_launcher(script)
    # text order: `*) TP=4` is the last assignment; heredoc bodies are skipped
    assert p.values == {"--pipeline-model-parallel-size": "4", "--tensor-model-parallel-size": "4"}
    assert p.switches == {"--sequence-parallel"}
    assert p.variables["DRY"] == "2"
    assert occ(p, "--pipeline-model-parallel-size")[0].line == 8
    assert occ(p, "--tensor-model-parallel-size")[0].line == 28


# --- int_value -------------------------------------------------------------------------------------

def test_int_value() -> None:
    p = parse_launcher("python t.py --num-layers ' 92 ' --recompute-granularity full --seq-length 4k\n")
    assert p.int_value("--num-layers") == 92
    assert p.int_value("--micro-batch-size") is None
    with pytest.raises(ValueError, match=r"--recompute-granularity.*full"):
        p.int_value("--recompute-granularity")
    with pytest.raises(ValueError, match=r"--seq-length.*4k"):
        p.int_value("--seq-length")


# --- input limits ----------------------------------------------------------------------------------

def test_oversize_input_raises_launcher_error() -> None:
    with pytest.raises(LauncherError, match=f"{MAX_LAUNCHER_BYTES + 1}.*{MAX_LAUNCHER_BYTES}"):
        parse_launcher("#" * (MAX_LAUNCHER_BYTES + 1))
    with pytest.raises(LauncherError, match=f"{MAX_LAUNCHER_BYTES + 1}.*{MAX_LAUNCHER_BYTES}"):
        parse_launcher(b"#" * (MAX_LAUNCHER_BYTES + 1))
    # the limit counts UTF-8 bytes, not characters
    with pytest.raises(LauncherError, match=str(MAX_LAUNCHER_BYTES + 2)):
        parse_launcher("é" * (MAX_LAUNCHER_BYTES // 2 + 1))
    assert isinstance(LauncherError("x"), ValueError)


def test_input_at_the_limit_is_accepted() -> None:
    p = parse_launcher("#" * MAX_LAUNCHER_BYTES)
    assert p.occurrences == ()


def test_bytes_input() -> None:
    p = parse_launcher("\ufeffTP=2\npython t.py --tensor-model-parallel-size $TP  # é\n".encode())
    assert p.values == {"--tensor-model-parallel-size": "2"}
    with pytest.raises(LauncherError, match="UTF-8"):
        parse_launcher(b"TP=\xff\xfe\n")


# --- hostile input ---------------------------------------------------------------------------------

HOSTILE = [
    'python t.py --num-layers "unbalanced',
    "python t.py --num-layers 'unbalanced",
    "A=( --num-layers 2",
    "A=( --num-layers 2 ))))",
    ")))(((",
    "$((",
    "X=$((",
    "X=$((1+",
    "python t.py --num-layers $((",
    "python t.py --num-layers ${",
    "X=${Y:-${Z:-",
    "`",
    "\\",
    "$",
    "${}",
    "${!x} ${x/a/b} ${x:0:2} ${#} $- $$ $? ${@:-x}",
    "--num-layers",
    "<<",
    "cat <<EOF\n--num-layers 1",
    "A=B\nB=A\nX=$((A))\n",
    "X=$((9999999999999999999999 * 99999999999999999999))",
    "X=$((" + "9" * 5000 + "))",
    "X=$((" + "(" * 3000 + "1" + ")" * 3000 + "))",
    "X=$((" + "-" * 5000 + "1))",
    "X=" + "$((" * 3000,
    "X=" + "${a:-" * 3000,
    "X=" + "$(" * 3000,
    '"' + "${a[@]" * 2000,
    "A=(" * 5000,
    "B=xxxxxxxxxxxxxxxx\n" + "B=$B$B\n" * 60 + "python t.py --num-layers $B\n",
    "A=(1 2 3)\n" + 'A+=("${A[@]}" "${A[@]}")\n' * 60 + "X=${A[@]}\n",
    "A=A\nX=$((A + A + A + A))\n" * 2000,
    bytes(range(256)).decode("latin-1") * 40,
    "\x00\x01--num-layers\x00 8\x7f\ufffd\u202e",
    "a\\\n" * 5000,
    "\r" * 1000 + "\n" * 1000,
    "$'--num-layers' 3 $\"x\"",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_never_raises_and_is_fast(text: str) -> None:
    start = time.perf_counter()
    p = parse_launcher(text)
    assert time.perf_counter() - start < 1.0
    assert isinstance(p, LauncherParse)
    check_invariants(text, p)


def test_self_referencing_variables_do_not_loop() -> None:
    p = parse_launcher("A=B\nB=A\npython t.py --num-layers $((A))\n")
    assert "too deeply" in unresolved(p, "--num-layers").reason


def test_value_doubling_is_capped() -> None:
    p = parse_launcher("B=xxxxxxxxxxxxxxxx\n" + "B=$B$B\n" * 60 + "python t.py --num-layers $B\n")
    assert "--num-layers" not in p.values
    assert p.warnings   # says the work limit was reached


def check_invariants(text: str, p: LauncherParse) -> None:
    assert set(p.values) <= KNOWN_VALUE_FLAGS
    assert p.switches <= KNOWN_SWITCH_FLAGS
    last: dict[str, FlagOccurrence] = {}
    lines = text.count("\n") + 1
    for o in p.occurrences:
        assert 1 <= o.line <= lines
        if o.flag in KNOWN_VALUE_FLAGS:
            last[o.flag] = o
        else:
            assert o.flag in KNOWN_SWITCH_FLAGS and o.value is None
    for flag, o in last.items():
        assert p.values.get(flag) == o.value
    for u in p.unresolved:
        assert u.flag in KNOWN_VALUE_FLAGS and u.reason


SNIPPETS = [
    "$((", "))", "${", "}", "$(", ")", "(", "`", '"', "'", "\\", "\n", " ", "\\\n", "#", "|", ";",
    "&&", "<<", "EOF", "=", "+=", "=(", "A", "B", "[@]", ":-", "-", "/", "%", "*", "0", "7", "$A",
    "--num-layers", "--pipeline-model-parallel-size", "--sequence-parallel", "--seq-length=", "x",
]


@settings(max_examples=300, deadline=1000)
@given(st.text(max_size=300))
def test_property_random_text_never_raises(text: str) -> None:
    check_invariants(text, parse_launcher(text))


@settings(max_examples=500, deadline=1000)
@given(st.lists(st.sampled_from(SNIPPETS), max_size=60).map("".join))
def test_property_shell_like_text_never_raises(text: str) -> None:
    check_invariants(text, parse_launcher(text))


@settings(max_examples=100, deadline=1000)
@given(st.binary(max_size=300))
def test_property_random_bytes_raise_only_launcher_error(data: bytes) -> None:
    try:
        p = parse_launcher(data)
    except LauncherError:
        return
    check_invariants(data.decode("utf-8"), p)
