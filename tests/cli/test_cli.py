"""The ``isplan`` CLI contract: exit codes, text and JSON output, receipts, and import isolation.

Every test runs the real command in a subprocess, as a launch script would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import GLM52_FULL, REPO, tiny_config


def isplan(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          input=stdin, cwd=REPO, timeout=60)


def test_check_valid_seed_split_text():
    p = isplan("check", "glm-5.2", "--split", "14,8,8,8,8,8,8,16")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "stage 1: 1-14 (full) [embedding]" in lines
    assert "stage 2: 15-22 (full)" in lines
    assert "VALID: every stage starts on a full indexer layer" in lines


@pytest.mark.parametrize(("engine", "layout", "unit"), [
    ("megatron", ("--split", "7,13,11,9,10,10,10,10"), "stage"),
    ("vllm", ("--pp", "4"), "rank"),
    ("maxtext", ("--ici-pipeline-parallelism", "4"), "stage of every repeat"),
])
def test_a_model_without_an_indexer_says_its_boundaries_are_free(engine, layout, unit):
    """Llama 3.1 70B has no DSA indexer: no layer shares top-k, so no stage start is constrained. The
    VALID line says so, in each engine's unit, instead of naming "full indexer layers" it has none of
    (Megatron's odd split starts stages at layers 8, 21, 32, ...: as valid as an even one)."""
    p = isplan("check", "llama-3.1-70b", "--engine", engine, *layout)
    assert p.returncode in (0, 1), p.stderr  # vLLM always judges memory: at its default context it overflows
    assert "boundary" not in p.stdout.split("verdict:")[-1]
    valid = [line for line in p.stdout.splitlines() if line.startswith("VALID")]
    assert valid == [f"VALID: no layer reuses another's top-k (no DSA indexer), so a {unit} may start on any layer"]


def test_check_invalid_control_lists_every_violation():
    p = isplan("check", "glm-5.2", "--split", "10,10,10,10,10,10,9,9")
    assert p.returncode == 1
    invalid = [line for line in p.stdout.splitlines() if line.startswith("INVALID:")]
    assert invalid == [
        "INVALID: stage 3 starts at shared layer 21; source is 19",
        "INVALID: stage 5 starts at shared layer 41; source is 39",
        "INVALID: stage 7 starts at shared layer 61; source is 59",
        "INVALID: stage 8 starts at shared layer 70; source is 67",
    ]


def test_check_json_contract():
    p = isplan("check", "glm-5.2", "--pp", "8", "--first", "14", "--last", "16", "--format", "json")
    assert p.returncode == 0, p.stderr
    body = json.loads(p.stdout)
    assert body["valid"] is True
    assert body["model"]["id"] == "glm-5.2" and body["model"]["num_layers"] == 78
    assert len(body["model"]["sha256"]) == 64
    keys = {"pp_rank", "vp_stage", "first_layer", "last_layer", "num_layers", "start_role", "source_layer",
            "source_pp_rank", "source_vp_stage"}
    assert all(keys <= set(s) for s in body["stages"])
    assert [s["num_layers"] for s in body["stages"]] == [14, 8, 8, 8, 8, 8, 8, 16]
    assert body["violations"] == [] and body["errors"] == []
    assert "--decoder-first-pipeline-num-layers" in body["megatron_flags"]
    # no --mtp-layers: no MTP layer is built (Megatron's and slime's --mtp-num-layers default None)
    assert body["layout_string"] == "Et*14|(t*8|)*6,t*16L"


def test_check_json_violation_fields():
    p = isplan("check", "glm-5.2", "--split", "10,10,10,10,10,10,9,9", "--format", "json")
    body = json.loads(p.stdout)
    v = body["violations"][0]
    assert {k: v[k] for k in ("pp_rank", "vp_stage", "layer", "source_layer")} == {
        "pp_rank": 2, "vp_stage": 0, "layer": 21, "source_layer": 19}
    assert "source" in v["message"]


def test_layout_string_and_vpp_via_cli():
    p = isplan("check", "deepseek-v3.2", "--pp", "16", "--layout", "Et*3|(tt|)*29,m|L", "--mtp-layers", "1",
               "--format", "json")
    body = json.loads(p.stdout)
    assert p.returncode == 0, body
    assert body["vpp"] == 2 and len(body["stages"]) == 32


@pytest.mark.parametrize(
    "args, words",
    [
        (("check", "glm-5.2"), "give a layout"),
        (("check", "glm-5.2", "--split", "10,x"), "entry 2"),
        (("check", "nope", "--split", "78"), "neither a preset"),
        (("check", "glm-5.2", "--split", "100000000"), "a stage holds 0 to 4,096 layers"),
        (("check", "glm-5.2", "--pp", "1", "--layout", "Et*78Xm|L"), "invalid character 'X'"),
        (("check", "glm-5.2", "--split", "78", "--pattern", "FQ"), "F and S"),
        (("check", "glm-5.2", "--split", "78", "--first", "3"), "--first does not apply when the layout is given by "
                                                                 "stage sizes (--split); drop it"),
        (("check", "glm-5.2", "--pp", "two"), "--pp must be a whole number, got 'two'"),
        (("check", "glm-5.2", "--pp", "0"), "--pp must be between 1 and 256, got 0"),
        (("check", "glm-5.2", "--pp", "8", "--tp", "4", "--cp", "8", "--ep", "32", "--gpus", "1048577"),
         "--gpus must be between 1 and 1,048,576"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(args, words):
    p = isplan(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert words in p.stderr
    assert "Traceback" not in p.stderr + p.stdout


def test_bad_config_file_names_the_field(tmp_config):
    raw = tiny_config(8, indexer_types=["full"] * 7)
    path = tmp_config(raw)
    p = isplan("check", str(path), "--split", "4,4", "--format", "json")
    assert p.returncode == 2
    err = json.loads(p.stdout)["errors"][0]
    assert err["field"] == "indexer_types" and "7 entries" in err["message"]


def test_megatron_rule_violation_exits_1():
    p = isplan("check", "glm-5.2", "--pp", "8")
    assert p.returncode == 1
    assert "78 must be divisible by --pipeline-model-parallel-size 8" in p.stdout


def test_roles_json():
    p = isplan("roles", "glm-5.2", "--format", "json")
    assert p.returncode == 0
    body = json.loads(p.stdout)
    assert body["full_layers"] == GLM52_FULL
    assert body["layers"][20] == {"layer": 21, "role": "shared", "source_layer": 19, "ffn": "moe",
                                  "has_indexer": False, "mtp": False, "attention_window": 0, "attention_chunk": 0,
                                  "mixer": "attention"}
    assert body["mtp_layers"][0]["layer"] == 79
    assert body["disagreements"] == []
    p = isplan("roles", "glm-5.2", "--pattern", "FSSS", "--format", "json")
    assert len(json.loads(p.stdout)["pattern_differences"]) == 39


def test_check_imports_only_the_core():
    code = (
        "import sys, io, contextlib\n"
        "from app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['check', 'glm-5.2', '--split', '14,8,8,8,8,8,8,16'])\n"
        "heavy = [m for m in ('fastapi', 'starlette', 'pydantic', 'jinja2', 'plotly', 'uvicorn') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ""


def test_help_lists_every_command_and_each_command_keeps_its_own_options():
    """``isplan check`` builds only its own parser; every command still answers with its options
    (each named in its ``--help``) and ``isplan --help`` still lists all ten."""
    commands = ["check", "roles", "receipt", "verify", "params", "memory", "time", "flops", "plan", "search"]
    top = isplan("--help")
    assert top.returncode == 0 and all(f"    {c} " in top.stdout for c in commands), top.stdout
    own = {"check": "--launcher", "receipt": "--also", "verify": "--config", "params": "--per-layer",
           "memory": "--inference", "time": "--timeline", "plan": "--objective", "search": "--pareto"}
    for command, option in own.items():
        p = isplan(command, "--help")
        assert p.returncode == 0 and option in p.stdout, (command, p.stderr)
    p = isplan("check", "glm-5.2", "--objective", "time")  # an option of another command is refused
    assert p.returncode == 2 and "unrecognized arguments: --objective" in p.stderr


# --------------------------------------------------------------------------- receipts


def _receipt(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    p = isplan("receipt", "glm-5.2", "--pp", "8", "--first", "14", "--last", "16",
               "--also", "conversion=--pp 2 --last 40", *extra)
    return p, json.loads(p.stdout)


def test_receipt_records_both_layouts_and_verifies(tmp_path):
    p, r = _receipt(tmp_path, "--model-revision", "a" * 40, "--engine-commit", "b" * 40)
    assert p.returncode == 0, p.stderr
    assert [lay["name"] for lay in r["layouts"]] == ["training", "conversion"]
    assert r["layouts"][1]["stage_sizes"] == [38, 40]
    assert r["model"]["sha256"] and r["model"]["canonical_sha256"]
    assert r["unpinned"] is False and r["valid"] is True
    assert {c["name"] for c in r["checks"]} >= {"model_source", "config_integrity", "engine_source",
                                                "boundary:training", "boundary:conversion", "hardware_canary"}
    path = tmp_path / "receipt.json"
    path.write_text(p.stdout)
    v = isplan("verify", str(path))
    assert v.returncode == 0, v.stdout + v.stderr
    assert v.stdout.startswith("VERIFIED")


def test_unpinned_receipt_warns(tmp_path):
    p, r = _receipt(tmp_path, "--model-revision", "main")
    assert r["unpinned"] is True
    assert "unpinned" in p.stderr
    assert [c["result"] for c in r["checks"] if c["name"] == "model_source"] == ["warn"]


def test_edited_stage_fails_verify_naming_the_stage(tmp_path):
    _, r = _receipt(tmp_path)
    r["layouts"][0]["stages"][2]["first_layer"] = 22
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(r))
    v = isplan("verify", str(path))
    assert v.returncode == 1
    assert "body_sha256" in v.stdout
    assert "layout 'training' stage 3: first_layer receipt 22 vs recomputed 23" in v.stdout


def test_changed_config_fails_verify(tmp_path, tmp_config):
    raw = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())
    path = tmp_config(raw)
    # engine hf reads the checkpoint's indexer_types, so the edit below moves a boundary
    p = isplan("receipt", str(path), "--split", "14,8,8,8,8,8,8,16", "--engine", "hf")
    assert p.returncode == 0, p.stderr
    receipt = tmp_path / "r.json"
    receipt.write_text(p.stdout)
    # a receipt never makes isplan open a path it names: the config is passed explicitly
    assert isplan("verify", str(receipt), "--config", str(path)).returncode == 0
    raw["indexer_types"][14] = "shared"  # layer 15 becomes shared: stage 2 now starts on shared
    path.write_text(json.dumps(raw))
    v = isplan("verify", str(receipt), "--config", str(path))
    assert v.returncode == 1
    assert "model.sha256" in v.stdout and "violations" in v.stdout


def test_a_receipt_of_a_config_under_a_long_path_verifies(tmp_path):
    """A checkpoint's config.json often lies deeper than the 80 characters a URL's model id may
    have (a preset id or sha256:...): the receipt names it by that path and still verifies."""
    folder = tmp_path / ("checkpoints-" + "x" * 90) / "glm-5.2"
    folder.mkdir(parents=True)
    path = folder / "config.json"
    path.write_text((REPO / "app/core/presets/glm-5.2.json").read_text())
    assert len(str(path)) > 100
    p = isplan("receipt", str(path), "--split", "14,8,8,8,8,8,8,16")
    assert p.returncode == 0, p.stderr
    receipt = tmp_path / "r.json"
    receipt.write_text(p.stdout)
    assert json.loads(p.stdout)["model"]["id"] == str(path)
    v = isplan("verify", str(receipt), "--config", str(path))
    assert v.returncode == 0, v.stdout + v.stderr


def test_verify_bad_input_exits_2(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    assert isplan("verify", str(path)).returncode == 2
    path.write_text("[]")
    p = isplan("verify", str(path))
    assert p.returncode == 2 and "JSON object" in p.stderr


# --------------------------------------------------------------------------- launcher scripts

SLIME_GLM52 = r"""#!/bin/bash
set -ex
NODES=32
PP=$(( NODES / 4 ))
MODEL_ARGS=(
   --dsa-indexer-topk-freq 4        # GLM-5.2 IndexShare
   --dsa-indexer-skip-topk-offset 3
   --mtp-num-layers 1
)
PERF_ARGS=(
   --tensor-model-parallel-size 4
   --sequence-parallel
   --pipeline-model-parallel-size $PP
   --decoder-first-pipeline-num-layers 14
   --decoder-last-pipeline-num-layers 16
   --context-parallel-size 8
   --expert-model-parallel-size 32
   --expert-tensor-parallel-size 1
   # --decoder-last-pipeline-num-layers 99  (commented out: must not count)
)
ray job submit --address="http://127.0.0.1:8265" \
   -- python3 train_async.py \
   --actor-num-nodes ${NODES} \
   ${MODEL_ARGS[@]} ${PERF_ARGS[@]}
"""


def test_launcher_slime_glm52_script_from_stdin():
    p = isplan("check", "glm-5.2", "--launcher", "-", "--format", "json", stdin=SLIME_GLM52)
    body = json.loads(p.stdout)
    assert [s["num_layers"] for s in body["stages"]] == [14, 8, 8, 8, 8, 8, 8, 16]
    # the layout is valid, but this cut-down script has no recompute, no offload and 4096-token
    # samples: a launcher states parallelism, so memory joins the verdict and blocks it; and it forgets
    # --allgather-cp, which DSA with CP 8 needs (transformer_config.py:3162-3177)
    assert body["valid"] is True and body["verdict"]["go"] is False
    assert {r["kind"] for r in body["verdict"]["blocking"]} == {"memory", "parallel"}
    assert [(r["code"], r["field"]) for r in body["verdict"]["blocking"] if r["kind"] == "parallel"] == \
        [("dsa_cp", "cp_comm_type")]
    assert p.returncode == 1, p.stderr
    assert body["parallel"]["equation"] == "TP 4 × CP 8 × PP 8 × DP 1 = 256 GPUs"
    vals = {flag: v["value"] for flag, v in body["launcher"]["values"].items()}
    assert vals["--tensor-model-parallel-size"] == "4" and vals["--context-parallel-size"] == "8"
    assert vals["--expert-model-parallel-size"] == "32" and vals["--pipeline-model-parallel-size"] == "8"
    # provenance: where each value was set (PP is $(( NODES / 4 )) from line 4, passed on script line 13)
    assert body["launcher"]["values"]["--pipeline-model-parallel-size"]["line"] == 13
    assert "--sequence-parallel" in body["launcher"]["switches"]


def test_launcher_conversion_layout_from_file(tmp_path):
    script = tmp_path / "convert.sh"
    script.write_text("TP=8\nPP=2\npython tools/convert_hf_to_torch_dist.py \\\n"
                      "  --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP \\\n"
                      "  --decoder-last-pipeline-num-layers 40 --expert-model-parallel-size 16\n")
    p = isplan("check", "glm-5.2", "--launcher", str(script), "--format", "json")
    body = json.loads(p.stdout)
    # the layout is valid; the training-memory and expert-grid checks of this bare conversion
    # script (1 node implied, ETP defaults to TP 8) block the verdict, and say so
    assert body["valid"] is True
    assert {r["kind"] for r in body["verdict"]["blocking"]} <= {"parallel", "memory"}
    assert p.returncode == 1
    assert [s["num_layers"] for s in body["stages"]] == [38, 40]
    assert body["model"]["mtp_layers"] == 0  # no --mtp-num-layers: no MTP layer is built


def test_launcher_sourcing_a_file_stdin_cannot_follow_exits_2_naming_it():
    script = 'SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"\nsource "${SCRIPT_DIR}/models/glm5.sh"\n' + SLIME_GLM52
    p = isplan("check", "glm-5.2", "--launcher", "-", stdin=script)
    assert p.returncode == 2 and "models/glm5.sh" in p.stderr and "Traceback" not in p.stderr


def test_launcher_unresolved_pipeline_flag_exits_2_naming_it():
    p = isplan("check", "glm-5.2", "--launcher", "-", stdin=SLIME_GLM52.replace("$PP", "$PP_FROM_ENV"))
    assert p.returncode == 2
    assert "--pipeline-model-parallel-size" in p.stderr and "$PP_FROM_ENV is not assigned" in p.stderr


def test_launcher_num_layers_mismatch_is_a_blocking_model_reason():
    p = isplan("check", "glm-5.2", "--launcher", "-", "--format", "json",
               stdin="EXTRA=(--num-layers 61)\n" + SLIME_GLM52.replace("train_async.py", "train_async.py ${EXTRA[@]}"))
    assert p.returncode == 1
    reasons = json.loads(p.stdout)["verdict"]["blocking"]
    assert {"kind": "model", "code": "num_layers_mismatch", "field": "num_layers",
            "message": "--num-layers 61 does not match the config's num_hidden_layers 78"} in reasons


def test_launcher_freq_offset_drive_roles_when_config_has_no_array(tmp_config):
    path = tmp_config(tiny_config(8))  # no indexer_types: every layer full by default
    script = "python x.py --pipeline-model-parallel-size 2 --dsa-indexer-topk-freq 4 --dsa-indexer-skip-topk-offset 3\n"
    p = isplan("check", str(path), "--launcher", "-", "--format", "json", stdin=script)
    # megatron, freq 4 offset 3 over 8 layers: full 1, 2, 3, 7; even split 4 + 4 starts at 5 (shared)
    assert p.returncode == 1
    assert json.loads(p.stdout)["violations"][0]["layer"] == 5


def test_launcher_excludes_other_layout_options():
    p = isplan("check", "glm-5.2", "--launcher", "-", "--pp", "8", stdin=SLIME_GLM52)
    assert p.returncode == 2 and "drop --pp" in p.stderr


def test_launcher_offers_the_config_json_at_its_checkpoint_path(tmp_path):
    """Issue 10: a config.json at --hf-checkpoint is offered as the model (CLI only)."""
    ckpt = tmp_path / "GLM-5.2"
    ckpt.mkdir()
    (ckpt / "config.json").write_text((REPO / "app/core/presets/glm-5.2.json").read_text())
    script = tmp_path / "run.sh"
    script.write_text("python3 train.py --hf-checkpoint ./GLM-5.2 --pipeline-model-parallel-size 8 "
                      "--decoder-first-pipeline-num-layers 14 --decoder-last-pipeline-num-layers 16\n")
    p = isplan("check", "glm-5.2", "--launcher", str(script), "--format", "json")
    assert json.loads(p.stdout)["launcher"]["candidate_config"] == str(ckpt / "config.json")
    assert f"isplan check {ckpt / 'config.json'} --launcher {script}" in p.stderr
