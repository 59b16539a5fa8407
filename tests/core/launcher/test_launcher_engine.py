"""The engine a launcher is written for (issue 16 item 4) and the import report the page shows
(every warning, each value's file and line). Expected engines follow the engines' entry points:
Megatron-LM's ``pretrain_*.py``, slime's ``train.py`` / ``train_async.py`` and its own flags
(THUDM/slime ``slime/utils/arguments.py`` at 624b824a), ``vllm serve``, ``sglang.launch_server``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from app.core.launcher import import_launcher, parse_launcher, training_engine
from app.core.model.config import load_preset
from app.core.plan import Plan
from tests.conftest import app_client

REPO = Path(__file__).resolve().parents[3]
GLM = load_preset("glm-5.2")
SLIME = """\
PERF_ARGS=(
   --tensor-model-parallel-size 4
   --pipeline-model-parallel-size 8
   --decoder-first-pipeline-num-layers 14
   --decoder-last-pipeline-num-layers 16
   --max-tokens-per-gpu 8192
)
CKPT_ARGS=(--hf-checkpoint $BASE_DIR/GLM-5.2 --load $BASE_DIR/GLM-5.2_slime)
ray job submit -- python3 train.py --actor-num-nodes 32 --actor-num-gpus-per-node 8 \\
   ${CKPT_ARGS[@]} ${PERF_ARGS[@]} --tensor-model-parallel-size 2 --tensor-model-parallel-size 4
"""


@pytest.mark.parametrize(("script", "engine"), [
    ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 78\n", "megatron"),
    ("torchrun ${D[@]} examples/classes/pretrain_gpt.py --num-layers 78\n", "megatron"),
    ("python pretrain_mamba.py --num-layers 78\n", "megatron"),
    ("python3 train.py --actor-num-nodes 4\n", "slime"),
    ("python3 train.py --max-tokens-per-gpu 8192\n", "slime"),
    ("A=(--allgather-cp)\npython3 train_async.py ${A[@]}\n", "slime"),
    ("PERF_ARGS=(--tensor-model-parallel-size 2)\npython3 train_async.py ${PERF_ARGS[@]}\n", "slime"),
    ("python3 train.py --tensor-model-parallel-size 2\n", None),
    ("deepspeed my_trainer.py --num-layers 78\n", None),
])
def test_training_engine_from_the_command(script, engine):
    guess = training_engine(parse_launcher(script, strict=True))
    assert guess.engine == engine, guess
    assert guess.line == script.count("\n")   # the trainer line is the last line of each script


def test_a_slime_launcher_imported_on_megatron_becomes_slime():
    imported = import_launcher(SLIME, GLM, Plan(model="glm-5.2", engine="megatron"))
    assert imported.plan.engine == "slime"
    assert imported.report["engine"] == {"name": "slime", "reason": imported.report["engine"]["reason"],
                                         "file": "", "line": 9}
    assert "--actor-num-gpus-per-node is a slime-only flag" in imported.report["engine"]["reason"]


@pytest.mark.parametrize("after", ["pkill -9 python", "pkill -9 sglang\nray stop --force\npkill -9 python\n",
                                   "/usr/bin/killall python3", "which python", "pgrep -f train.py"])
def test_a_command_naming_python_after_the_run_does_not_take_the_trainer_lines_place(after):
    """slime's ``examples/on_policy_distillation/run-qwen3-8B-opd-megatron.sh`` (624b824a) ends with
    ``pkill -9 python``: bash runs ``train.py`` first and only then kills what is left, so the trainer
    line stays line 9 and its flags the plan's (before, the ``pkill`` line became the trainer, the
    engine fell back to Megatron and the trainer line's flags were lost)."""
    imported = import_launcher(SLIME + after + "\n", GLM, Plan(model="glm-5.2", engine="megatron"))
    assert imported.report["engine"]["name"] == "slime" and imported.report["engine"]["line"] == 9
    assert (imported.plan.engine, imported.plan.tp, imported.plan.pp, imported.plan.gpus) == ("slime", 4, 8, 256)


def test_an_engine_given_explicitly_is_kept_with_a_warning():
    imported = import_launcher(SLIME, GLM, Plan(model="glm-5.2", engine="megatron"), keep_engine=True)
    assert imported.plan.engine == "megatron"
    assert any("written for slime" in w and "checked as megatron" in w for w in imported.warnings)


def test_the_report_carries_every_warning_and_each_values_file_and_line():
    report = import_launcher(SLIME, GLM, Plan(model="glm-5.2")).report
    assert report["values"]["--tensor-model-parallel-size"] == {"value": "4", "file": "", "line": 10}
    assert report["values"]["--pipeline-model-parallel-size"] == {"value": "8", "file": "", "line": 3}
    assert report["trainer"]["line"] == 9 and report["trainer"]["at"] == "line 9"
    warnings = report["warnings"]
    # three TP values in argparse order: 4 (line 2, PERF_ARGS), 2 and 4 (line 10); the last is used
    assert ("--tensor-model-parallel-size is set 3 times: 4 (line 2), 2 (line 10), 4 (line 10); "
            "the last one (4) is used") in warnings
    assert any(w.startswith("--hf-checkpoint (line 8) is unresolved: $BASE_DIR") for w in warnings)
    assert any(w.startswith("--load (line 8) is unresolved") for w in warnings)
    assert any("builds no MTP layer" in w for w in warnings)


@pytest.mark.parametrize(("script", "engine"), [
    ("export VLLM_PP_LAYER_PARTITION=38,40\nvllm serve zai-org/GLM-5.2 -tp 8 -pp 2\n", "vllm"),
    ("SGLANG_PP_LAYER_PARTITION=38,40 python3 -m sglang.launch_server --model-path m --tp 8 --pp-size 2\n", "sglang"),
    ("sglang serve --model-path m --pp-size 2\n", "sglang"),
    ("A=(--tensor-parallel-size 8 --pipeline-parallel-size 2)\npython -m vllm.entrypoints.openai.api_server "
     "--model m \"${A[@]}\"\n", "vllm"),
])
def test_serving_launches_take_their_engine(script, engine):
    imported = import_launcher(script, GLM, Plan(model="glm-5.2"))
    assert imported.plan.engine == engine and imported.plan.pp == 2
    assert imported.report["engine"]["name"] == engine
    kept = import_launcher(script, GLM, Plan(model="glm-5.2", engine="megatron"), keep_engine=True)
    assert kept.plan.engine == "megatron"


def test_a_serving_launch_through_an_array_and_a_sourced_file(tmp_path):
    (tmp_path / "env.sh").write_text("export VLLM_PP_LAYER_PARTITION=38,40\nTP=8\n")
    run = tmp_path / "serve.sh"
    run.write_text('source "$(dirname "$0")/env.sh"\nARGS=(-tp $TP -pp 2)\nvllm serve m "${ARGS[@]}"\n')
    imported = import_launcher(run.read_text(), GLM, Plan(model="glm-5.2"), path=str(run))
    assert (imported.plan.engine, imported.plan.tp, imported.plan.pp, imported.plan.split) == ("vllm", 8, 2, (38, 40))
    assert imported.report["values"]["partition"] == {"value": "38,40", "file": str(tmp_path / "env.sh"), "line": 1}


def test_cli_takes_the_scripts_engine_unless_engine_is_given(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(SLIME)

    def check(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "app", "check", "glm-5.2", "--launcher", str(script),
                              "--format", "json", *extra], capture_output=True, text=True, cwd=REPO, timeout=60)
        assert out.returncode in (0, 1), out.stderr
        return json.loads(out.stdout)

    body = check()
    assert body["engine"] == "slime" and body["launcher"]["engine"]["name"] == "slime"
    assert check("--engine", "megatron")["engine"] == "megatron"


def test_the_page_takes_the_scripts_engine_unless_one_is_chosen(tmp_path):
    """The page's own engine (its URL always names one) does not override the script's; the launcher
    form's engine choice does (issue 16: the import takes the engine the script is written for)."""
    client = app_client(tmp_path)

    def engine_after(query: str, **form: str) -> str:
        r = client.post("/launcher", data={"script": SLIME, "query": query, **form}, headers={"HX-Request": "true"},
                        follow_redirects=False)
        assert r.status_code == 200, r.text[-500:]
        return dict(parse_qsl(urlsplit(r.headers["hx-push-url"]).query)).get("engine", "megatron")

    assert engine_after("model=glm-5.2") == "slime"
    assert engine_after("model=glm-5.2&engine=megatron") == "slime"
    assert engine_after("model=glm-5.2", launcher_engine="megatron") == "megatron"
    assert engine_after("model=glm-5.2&engine=slime", launcher_engine="hf") == "hf"
