"""Real public launchers keep importing to the plans they state.

* THUDM/slime ``scripts/run-*.sh`` (with the ``scripts/models/*.sh`` they source), read from a
  local snapshot of the repository when one is on this machine (``ISPLAN_SLIME_REPO``, default the
  search tool's mirror); their text is not copied into this repository. Each expected value below
  was read off the script by hand (PERF_ARGS, the ``--actor-num-*`` line, the model file).
* Launchers in the shape of NVIDIA/Megatron-LM ``examples/gpt3/train_gpt3_175b_distributed.sh``
  (157006d6), a vLLM ``docker run`` and Kubernetes-style SGLang deployment, written here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app.core.launcher import import_launcher
from app.core.model.config import load_preset
from app.core.plan import Plan

SLIME_REPO = Path(os.environ.get("ISPLAN_SLIME_REPO", "/work/.mirror/THUDM+slime/repo"))
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"


def slime_tree(tmp_path: Path, run: str, model: str) -> Path:
    """scripts/<run> and scripts/models/<model> from the slime snapshot, at the commit cited."""
    if not SLIME_REPO.exists():
        pytest.skip(f"no THUDM/slime snapshot at {SLIME_REPO}")
    (tmp_path / "scripts/models").mkdir(parents=True)
    for rel in (f"scripts/{run}", f"scripts/models/{model}"):
        out = subprocess.run(["git", "--git-dir", str(SLIME_REPO), "show", f"{SLIME_COMMIT}:{rel}"],
                             capture_output=True, timeout=30)
        if out.returncode != 0:
            pytest.skip(f"{rel} at {SLIME_COMMIT[:8]} is not in the snapshot")
        (tmp_path / rel).write_bytes(out.stdout)
    return tmp_path / "scripts" / run


def imported(path: Path, preset: str):
    return import_launcher(path.read_text(), load_preset(preset), Plan(model=preset), path=str(path))


def test_slime_glm52_recipe(tmp_path):
    run = slime_tree(tmp_path, "run-glm5.2-744B-A40B.sh", "glm5.2-744B-A40B.sh")
    got = imported(run, "glm-5.2")
    p = got.plan
    # PERF_ARGS: TP4 SP PP8 first 14 last 16 CP8 EP32 ETP1, recompute full/uniform/1, 8192 tokens/GPU;
    # OPTIMIZER_ARGS: offload + d2h overlap + precision-aware; --actor-num-nodes 32 x 8 GPUs = 256
    assert (p.engine, p.tp, p.pp, p.first, p.last, p.cp, p.ep, p.etp, p.sp) == \
        ("slime", 4, 8, 14, 16, 8, 32, 1, True)
    assert (p.recompute, p.recompute_method, p.recompute_num_layers, p.tokens_per_gpu) == ("full", "uniform", 1, 8192)
    assert (p.optimizer_cpu_offload, p.overlap_cpu_optimizer_d2h_h2d, p.use_precision_aware_optimizer, p.gpus, p.global_batch) == (True, True, True, 256, 64)
    # the model file: 3 + 75 layers, hidden 6144, 64 heads, 256 experts of 2048, vocab padded to 16
    assert (p.num_layers, p.hidden_size, p.num_attention_heads, p.num_experts, p.moe_ffn_hidden_size, p.make_vocab_size_divisible_by) == \
        (78, 6144, 64, 256, 2048, 16)
    assert p.mtp_layers is None   # no --mtp-num-layers: no MTP layer is built
    # MODEL_ARGS: --allgather-cp (the all-gather CP layout DSA with CP needs), --moe-grouped-gemm, the MLA
    # flags (2048 / 512 / 192 / 64 / 256); slime always builds the distributed optimizer: the launch is GO
    assert (p.cp_comm_type, p.moe_grouped_gemm, p.multi_latent_attention, p.no_distributed_optimizer) == \
        ("allgather", True, True, False)
    assert (p.q_lora_rank, p.kv_lora_rank, p.qk_head_dim, p.qk_pos_emb_head_dim, p.v_head_dim) == (2048, 512, 192, 64, 256)
    from app.core.evaluate import evaluate

    ev = evaluate(p, load_preset("glm-5.2"), extra_errors=got.errors)
    assert ev.verdict.go, [r.message for r in ev.verdict.blocking]
    model_file = str(tmp_path / "scripts/models/glm5.2-744B-A40B.sh")
    assert got.report["values"]["--num-layers"]["file"] == model_file
    assert got.report["engine"]["name"] == "slime"
    assert any(w.startswith("--hf-checkpoint") and "$BASE_DIR" in w for w in got.warnings)


def test_slime_kimi_k2_recipe(tmp_path):
    run = slime_tree(tmp_path, "run-kimi-k2-Instruct.sh", "kimi-k2.sh")
    p = imported(run, "kimi-k2").plan
    # PERF_ARGS: TP8 SP PP8 CP4 EP32 ETP1 last 5, recompute full, 16384 tokens/GPU; 32 nodes x 8
    assert (p.engine, p.tp, p.pp, p.last, p.cp, p.ep, p.etp, p.sp, p.tokens_per_gpu, p.gpus) == \
        ("slime", 8, 8, 5, 4, 32, 1, True, 16384, 256)
    assert p.num_layers == 61


MEGATRON_175B = """\
#!/bin/bash
# GPT-3 175B in the shape of Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS_PER_NODE=8
NUM_NODES=1
CHECKPOINT_PATH=$1
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --attention-backend auto # flash/fused/unfused/local
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --rampup-batch-size 16 16 5859375
    --fp16
)
MODEL_PARALLEL_ARGS=(
\t--tensor-model-parallel-size 8
\t--pipeline-model-parallel-size 16
)
torchrun ${DISTRIBUTED_ARGS[@]} examples/classes/pretrain_gpt.py \\
    ${GPT_MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]} \\
    --save $CHECKPOINT_PATH --load $CHECKPOINT_PATH
""".replace("\\t", "\t")


def test_megatron_gpt3_175b_shape():
    got = import_launcher(MEGATRON_175B, load_preset("llama-3.1-70b"), Plan(model="llama-3.1-70b"))
    p = got.plan
    # TP 8 x PP 16; torchrun's 1 node x 8 processes; 96 layers, 2048 tokens, micro-batch 1 of 1536
    assert (p.engine, p.tp, p.pp, p.gpus, p.num_layers, p.hidden_size, p.num_attention_heads) == \
        ("megatron", 8, 16, 8, 96, 12288, 96)
    assert (p.seq_length, p.mbs, p.global_batch) == (2048, 1, 1536)
    assert got.report["engine"]["reason"] == "pretrain_gpt.py is a Megatron-LM entry point"
    assert any(w.startswith("--load (line 32) is unresolved") and "positional" in w for w in got.warnings)


def test_vllm_docker_run_shape():
    """vLLM's recipes run the ``vllm/vllm-openai`` image with the model and flags after it: the image's
    entrypoint is ``vllm serve`` (vllm-project/vllm ``docker/Dockerfile`` @ dead20ba)."""
    script = ("#!/bin/bash\nMODEL=zai-org/GLM-5.2\n"
              "docker run --gpus all --ipc=host -p 8000:8000 \\\n"
              "  -e VLLM_PP_LAYER_PARTITION=18,20,20,20 \\\n"
              "  -v ~/.cache/huggingface:/root/.cache/huggingface \\\n"
              "  docker.io/vllm/vllm-openai:v0.11.0 \\\n"
              "  $MODEL --tensor-parallel-size 8 --pipeline-parallel-size 4 --max-model-len 131072\n")
    got = import_launcher(script, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    assert (got.plan.engine, got.plan.tp, got.plan.pp, got.plan.split) == ("vllm", 8, 4, (18, 20, 20, 20))
    assert got.report["serve"]["model"] == "zai-org/GLM-5.2"
    assert got.report["serve"]["provenance"]["partition"]["how"] == "docker_env"
    assert got.report["serve"]["provenance"]["partition"]["line"] == 4


def test_vllm_serve_again_after_the_image_is_refused_as_vllm_refuses_it():
    """``IMAGE vllm serve MODEL`` runs ``vllm serve vllm serve MODEL``: vLLM takes ``vllm`` for the
    model and stops on the rest (unrecognized arguments); an ``--entrypoint`` of one's own is
    another command, which is not read as the image's."""
    from app.core.launcher.importer import LauncherImportError

    doubled = "docker run --gpus all vllm/vllm-openai:latest vllm serve zai-org/GLM-5.2 --tensor-parallel-size 8\n"
    with pytest.raises(LauncherImportError, match=r"entrypoint is already `vllm serve`.*unrecognized arguments"):
        import_launcher(doubled, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    own = "docker run --entrypoint /bin/bash vllm/vllm-openai:latest -c 'sleep 1'\n"
    with pytest.raises(LauncherImportError):
        import_launcher(own, load_preset("glm-5.2"), Plan(model="glm-5.2"))


def test_sglang_kubernetes_deployment_shape():
    spec = """\
apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      containers:
        - name: sglang
          image: lmsysorg/sglang:latest
          command: ["python3", "-m", "sglang.launch_server"]
          args: ["--model-path", "zai-org/GLM-5.2", "--tp-size", "8", "--pp-size", "4", "--port", "30000"]
          env:
            - name: SGLANG_PP_LAYER_PARTITION
              value: "22,20,20,16"
            - name: HF_TOKEN
              valueFrom:
                secretKeyRef: {name: hf, key: token}
          resources:
            limits: {nvidia.com/gpu: 8}
"""
    got = import_launcher(spec, load_preset("glm-5.2"), Plan(model="glm-5.2"))
    assert (got.plan.engine, got.plan.tp, got.plan.pp, got.plan.split) == ("sglang", 8, 4, (22, 20, 20, 16))
    assert got.report["serve"]["provenance"]["partition"] == {"value": "22,20,20,16", "line": 13, "how": "k8s_env",
                                                              "file": ""}


MEGATRON_REPO = Path(os.environ.get("ISPLAN_MEGATRON_REPO", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def test_megatron_lms_own_example_scripts_are_read_or_refused_by_name(tmp_path):
    """Every shell script under NVIDIA/Megatron-LM ``examples/`` (at the commit cited, with the files
    they source beside them) is a plan or a named refusal - never a crash; its training launches
    read their flags (``examples/gpt3/train_gpt3_175b_distributed.sh``: TP 8, PP 16;
    ``examples/mixtral/train_mixtral_8x7b_distributed.sh``: PP 4, EP 8), and a script whose Python
    command trains nothing is refused (``tools/preprocess_data.py``)."""
    if not MEGATRON_REPO.exists():
        pytest.skip(f"no NVIDIA/Megatron-LM snapshot at {MEGATRON_REPO}")
    archive = subprocess.run(["git", "--git-dir", str(MEGATRON_REPO), "archive", MEGATRON_COMMIT, "examples"],
                             capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.skip(f"examples/ at {MEGATRON_COMMIT[:8]} is not in the snapshot")
    subprocess.run(["tar", "x", "-C", str(tmp_path)], input=archive.stdout, check=True, timeout=120)
    scripts = sorted((tmp_path / "examples").rglob("*.sh"))
    assert len(scripts) > 100
    got: dict[str, Plan | str] = {}
    for script in scripts:
        name = str(script.relative_to(tmp_path))
        try:
            got[name] = import_launcher(script.read_text(), load_preset("llama-3.1-70b"), Plan(model="llama-3.1-70b"),
                                        path=str(script)).plan
        except ValueError as exc:   # LauncherImportError: a refusal names what it could not read
            assert str(exc), name
            got[name] = str(exc)
    gpt3 = got["examples/gpt3/train_gpt3_175b_distributed.sh"]
    mixtral = got["examples/mixtral/train_mixtral_8x7b_distributed.sh"]
    assert isinstance(gpt3, Plan) and (gpt3.engine, gpt3.tp, gpt3.pp) == ("megatron", 8, 16)
    assert isinstance(mixtral, Plan) and (mixtral.pp, mixtral.ep) == (4, 8)
    assert "is not a training entry point" in str(got["examples/academic_paper_scripts/detxoify_lm/annotations/preprocess.sh"])
    assert sum(isinstance(v, Plan) for v in got.values()) >= 30
