"""Reading serve launches (shell scripts, Kubernetes-style specs) and the export -> import round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.engines.serving import best_serving_partition, export_partition
from app.core.evaluate import evaluate
from app.core.launcher import (
    ServeLauncherError,
    import_launcher,
    parse_serve_launcher,
)
from app.core.model.config import load_model
from app.core.model.serving_memory import served_weight_dtype
from app.core.plan import Plan

GLM52 = load_model("glm-5.2")


@pytest.mark.parametrize("engine,pp", [("vllm", 2), ("vllm", 4), ("vllm", 8), ("sglang", 4), ("sglang", 8)])
def test_export_import_round_trip(engine, pp):
    best = best_serving_partition(GLM52, engine, pp, objective="layers")[0]
    for model in ("zai-org/GLM-5.2", "/data/my models/GLM 5.2 (fp8)", "x'y\"z$HOME"):
        e = export_partition(GLM52, engine, pp, best.sizes, tp=8, model=model)
        launch = parse_serve_launcher(e["script"])
        assert (launch.engine, launch.model, launch.tp, launch.pp, launch.partition) == (
            engine, model, 8, pp, best.sizes)
        one_line = parse_serve_launcher(f"{e['env_line']} {e['command']}")
        assert one_line.partition == best.sizes and one_line.provenance["partition"].how == "prefix"


LLAMA70 = load_model("llama-3.1-70b")


@settings(max_examples=150, deadline=None)
@given(engine=st.sampled_from(["vllm", "sglang"]), cfg=st.sampled_from([GLM52, LLAMA70]),
       tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 8),
       context=st.sampled_from([None, 4096, 131072, 200_000]), kv_dtype=st.sampled_from(["bf16", "fp8"]),
       long_context=st.booleans(), weight_dtype=st.sampled_from([None, "bf16", "fp8"]),
       fraction=st.sampled_from([None, 0.8, 0.95, 1.0]), expert=st.sampled_from(["none", "half", "tp"]),
       replicas=st.sampled_from([None, 2, 4]), attention=st.booleans(), mtp=st.booleans(), data=st.data())
def test_a_served_plan_exports_and_imports_back_to_itself(engine, cfg, tp, pp, context, kv_dtype, long_context,
                                                          weight_dtype, fraction, expert, replicas, attention, mtp,
                                                          data):
    """Differential: any serving plan the page or the CLI exports (a partition, TP, a stated context,
    the KV cache dtype, the long-context override, the weights' dtype as served, the GPU share, expert
    and data parallelism) is the same plan when
    its serve script is imported again, as a script or as one line - the memory the
    verdict judged is the memory the command asks for. vLLM names BF16 only for a DSA model (whose
    ``auto`` may be FP8); for another model, and for SGLang, BF16 is the engine's ``auto``."""
    # vLLM's data-parallel ranks, and its expert parallelism TP x DP; SGLang's --ep-size any divisor of TP,
    # its --dp-size replicas or data-parallel attention
    dp = replicas
    dp_attention = engine == "sglang" and attention and dp is not None
    ranks = tp * (dp or 1) if engine == "vllm" else tp
    ep = {"none": 1, "tp": ranks, "half": tp // 2 if engine == "sglang" and tp > 1 else ranks}[expert]
    n = cfg.num_hidden_layers
    cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), min_size=pp - 1, max_size=pp - 1)))
    sizes = tuple(b - a for a, b in zip([0, *cuts], [*cuts, n]))
    e = export_partition(cfg, engine, pp, sizes, tp=tp, model="org/model", context=context, kv_dtype=kv_dtype,
                         allow_long_context=long_context, weight_dtype=weight_dtype, memory_fraction=fraction,
                         ep=ep, dp=dp or 1, dp_attention=dp_attention, mtp=mtp)
    base = Plan(model=cfg.id)
    for text in (e["script"], f"{e['env_line']} {e['command']}\n"):
        got = import_launcher(text, cfg, base).plan
        assert (got.engine, got.tp, got.pp, got.split) == (engine, tp, pp, sizes)
        assert got.context == context
        assert got.kv_dtype == kv_dtype
        assert got.allow_long_context is long_context
        assert served_weight_dtype(cfg, got.weight_dtype) == served_weight_dtype(cfg, weight_dtype)
        assert got.gpu_memory_utilization == fraction
        assert (got.ep, got.dp, got.enable_dp_attention) == (ep, dp, dp_attention)
        assert got.mtp_layers == (1 if mtp else None)   # the MTP draft: speculative decoding with the MTP layers
    flags = e["command"].split()
    named_bf16 = "bfloat16" in flags
    assert named_bf16 == (engine == "vllm" and kv_dtype == "bf16" and cfg.has_indexer)


def test_memory_settings_of_a_launch_are_read_or_named():
    """--max-model-len / --context-length, --kv-cache-dtype, the GPU share (--gpu-memory-utilization /
    --mem-fraction-static) and expert parallelism become the plan's context, KV dtype,
    gpu_memory_utilization and ep;
    the memory flags no plan field carries are warnings naming them; ``auto`` keeps the plan's KV
    dtype and says so; a KV dtype the memory model does not cover is refused, naming the flag."""
    got = import_launcher("vllm serve m -tp 8 --max-model-len=65536 --kv-cache-dtype fp8_ds_mla "
                          "--gpu-memory-utilization 0.95 --enable-expert-parallel\n", GLM52, Plan(model="glm-5.2"))
    assert (got.plan.context, got.plan.kv_dtype, got.plan.gpu_memory_utilization, got.plan.ep) == (
        65536, "fp8", 0.95, 8)   # --enable-expert-parallel: EP = TP
    assert not got.warnings
    sg = import_launcher("python -m sglang.launch_server --model-path m --context-length 32768 "
                         "--kv-cache-dtype auto --mem-fraction-static 0.8 --dp-size 2\n", GLM52, Plan(model="glm-5.2"))
    assert (sg.plan.engine, sg.plan.context, sg.plan.kv_dtype) == ("sglang", 32768, "bf16")
    assert (sg.plan.gpu_memory_utilization, sg.plan.dp, sg.plan.enable_dp_attention) == (0.8, 2, False)
    assert [w.split(" (")[0] for w in sg.warnings] == ["--kv-cache-dtype auto"]
    for bad in ("1.5", "0", "most"):
        with pytest.raises(Exception, match="--gpu-memory-utilization is '" + bad):
            import_launcher(f"vllm serve m --gpu-memory-utilization {bad}\n", GLM52, Plan(model="glm-5.2"))
    with pytest.raises(Exception, match="--kv-cache-dtype 'int8'"):
        import_launcher("vllm serve m --kv-cache-dtype int8\n", GLM52, Plan(model="glm-5.2"))
    # vLLM's human_readable_int: a lowercase k is 1,000 in every build; 1M was 2^20, then 10^6
    for text, tokens in (("128k", 128_000), ("25.6k", 25_600), ("131072", 131_072)):
        assert parse_serve_launcher(f"vllm serve m --max-model-len {text}\n").context == tokens
    for text in ("1M", "16K", "1m"):
        with pytest.raises(ServeLauncherError, match=f"'{text}': the suffix .* means different numbers"):
            parse_serve_launcher(f"vllm serve m --max-model-len {text}\n")
    with pytest.raises(ServeLauncherError, match=r"context length .* is '128k'; it must be a whole number"):
        parse_serve_launcher("python -m sglang.launch_server --model-path m --context-length 128k\n")


def test_script_with_variables_continuations_and_comments():
    text = (
        "#!/bin/bash\n"                                   # 1
        "set -euo pipefail\n"                             # 2
        "MODEL=zai-org/GLM-5.2   # the checkpoint\n"     # 3
        "TP=8\n"                                          # 4
        "export VLLM_PP_LAYER_PARTITION='18,20,20,20'\n"  # 5
        "nohup vllm serve ${MODEL} \\\n"                 # 6
        "    --tensor-parallel-size $TP \\\n"             # 7
        "    --max-model-len 131072 \\\n"                 # 8
        "    --pipeline-parallel-size=4 > serve.log 2>&1 &\n"  # 9
        "echo started\n"
    )
    launch = parse_serve_launcher(text)
    assert (launch.engine, launch.model, launch.tp, launch.pp, launch.partition) == (
        "vllm", "zai-org/GLM-5.2", 8, 4, (18, 20, 20, 20))
    assert (launch.context, launch.kv_dtype) == (131072, None)   # --max-model-len; no --kv-cache-dtype
    lines = {k: v.line for k, v in launch.provenance.items()}
    assert lines == {"engine": 6, "model": 6, "tp": 7, "context": 8, "pp": 9, "partition": 5}


def test_kubernetes_env_list_with_block_args():
    text = """\
containers:
  - name: sglang
    image: lmsysorg/sglang:latest
    command: ["python3", "-m", "sglang.launch_server"]
    args:
      - --model-path
      - "zai-org/GLM-5.2"
      - --tp-size
      - "8"
      - --pp-size
      - "2"
    env:
      - name: SGLANG_PP_LAYER_PARTITION
        value: "38,40"
      - name: NCCL_DEBUG
        value: INFO
"""
    launch = parse_serve_launcher(text)
    assert (launch.engine, launch.model, launch.tp, launch.pp, launch.partition) == (
        "sglang", "zai-org/GLM-5.2", 8, 2, (38, 40))
    assert launch.provenance["partition"].line == 14 and launch.provenance["partition"].how == "k8s_env"
    assert launch.provenance["tp"].line == 9 and launch.provenance["pp"].line == 11


def test_kubernetes_env_pasted_beside_a_shell_command():
    text = 'env:\n  - {name: VLLM_PP_LAYER_PARTITION, value: "38,40"}\nvllm serve m -tp 4 -pp 2\n'
    launch = parse_serve_launcher(text)
    assert launch.partition == (38, 40) and launch.tp == 4 and launch.pp == 2


def test_sh_c_args_are_read_as_shell():
    text = 'command: ["/bin/sh", "-c"]\nargs:\n  - "vllm serve m --tensor-parallel-size 2 --pipeline-parallel-size 2"\n'
    launch = parse_serve_launcher(text)
    assert (launch.engine, launch.tp, launch.pp, launch.partition) == ("vllm", 2, 2, None)
    assert launch.provenance["tp"].line == 3


def test_docker_e_flag_sets_the_partition():
    text = ("docker run --gpus all -e SGLANG_PP_LAYER_PARTITION=23,23,23,24 img "
            "python3 -m sglang.launch_server --model-path /m --tp-size 1 --pp-size 4")
    assert parse_serve_launcher(text).partition == (23, 23, 23, 24)


def test_unexported_assignment_does_not_reach_the_engine():
    launch = parse_serve_launcher("VLLM_PP_LAYER_PARTITION=38,40\nvllm serve m --pipeline-parallel-size 2\n")
    assert launch.partition is None and "never exported" in launch.warnings[0]
    exported = parse_serve_launcher("VLLM_PP_LAYER_PARTITION=38,40\nexport VLLM_PP_LAYER_PARTITION\n"
                                    "vllm serve m --pipeline-parallel-size 2\n")
    assert exported.partition == (38, 40)


def test_a_prefix_assignment_overrides_the_exported_value_for_that_command():
    launch = parse_serve_launcher("export VLLM_PP_LAYER_PARTITION=38,40\n"
                                  "VLLM_PP_LAYER_PARTITION=39,39 vllm serve m -pp 2\n")
    assert launch.partition == (39, 39) and launch.provenance["partition"].how == "prefix"


def test_defaults_and_other_engines_variable():
    launch = parse_serve_launcher("export SGLANG_PP_LAYER_PARTITION=1,2\nvllm serve m\n")
    assert (launch.tp, launch.pp, launch.partition) == (1, 1, None)
    assert "ignored" in launch.warnings[0]


@pytest.mark.parametrize("text,match", [
    ("echo hello\n", "no serve command"),
    ("vllm serve a\nvllm serve b\n", r"2 serve commands \(lines 1, 2\)"),
    ("vllm serve $MODEL\n", "model is missing or cannot be resolved"),
    ("vllm serve m --tensor-parallel-size $TP\n", r"line 1: --tensor-parallel-size \$TP cannot be resolved"),
    ("vllm serve m --pipeline-parallel-size two\n", "pipeline parallel size is 'two'"),
    ("export VLLM_PP_LAYER_PARTITION=$(cat p.txt)\nvllm serve m -pp 2\n", "VLLM_PP_LAYER_PARTITION cannot be resolved"),
    (('env:\n  - name: VLLM_PP_LAYER_PARTITION\n    value: "38,40"\nexport VLLM_PP_LAYER_PARTITION=39,39\n'
     "vllm serve m -pp 2\n"), r"two different values: '38,40' \(line 3\), '39,39' \(line 4\)"),
    ("export VLLM_PP_LAYER_PARTITION=38,x\nvllm serve m -pp 2\n", "not a comma list of whole numbers"),
    ("vllm serve 'm --tensor-parallel-size 2\n", "line 1: unterminated '"),
    ("python -m sglang.launch_server --tp-size 2\n", "--model-path"),
    ("args: not-a-list\n", "args must be a list"),
    ("vllm serve m -tp 8 --config serve.yaml\n", "line 1: --config serve.yaml: vLLM reads further options from"),
    ("python -m sglang.launch_server --model-path m --config s.yaml\n", "--config s.yaml: SGLang reads further"),
    ("vllm serve m --speculative-config.method\n", "--speculative-config.method has no value"),
    ("vllm serve m --speculative-config.method $METHOD\n", r"--speculative-config.method \$METHOD cannot be resolved"),
])
def test_fails_closed(text, match):
    with pytest.raises(ServeLauncherError, match=match):
        parse_serve_launcher(text)


def test_too_large_and_not_utf8():
    with pytest.raises(ServeLauncherError, match="over the limit"):
        parse_serve_launcher("#" * ((1 << 20) + 1))
    with pytest.raises(ServeLauncherError, match="not UTF-8"):
        parse_serve_launcher(b"vllm serve \xff")


def test_the_launched_partition_is_the_plan_the_evaluation_judges():
    """The app's path for a serve launcher (the CLI's --launcher, the page's import): the launch
    becomes the plan and evaluate() judges it. 19,20,20,19 starts ranks on layers 20, 40, 60, which
    are shared (GLM-5.2's full layers are 1-3 and 7 + 4k, FACTS.md); 18,20,20,20 starts on 19, 39,
    59, all full, and is offered as the serve command at the 128k context it was judged at, in BF16 KV
    (named: a DSA model's ``auto`` may be FP8 in vLLM)."""
    bad = import_launcher("export VLLM_PP_LAYER_PARTITION=19,20,20,19\n"
                          "vllm serve zai-org/GLM-5.2 -tp 8 -pp 4\n", GLM52, Plan(model="glm-5.2"))
    assert bad.report["serve"]["partition"] == [19, 20, 20, 19]
    ev = evaluate(bad.plan, GLM52)
    assert [v.layer for v in ev.check.boundary.violations] == [20, 40, 60]
    assert not ev.verdict.go and "boundary" in {r.kind for r in ev.verdict.blocking}
    assert "serve_command" not in ev.exports()   # no serve command for a NO-GO plan
    good = import_launcher("export VLLM_PP_LAYER_PARTITION=18,20,20,20\n"
                           "vllm serve zai-org/GLM-5.2 -tp 8 -pp 4\n", GLM52, Plan(model="glm-5.2", context=131072))
    ev = evaluate(good.plan, GLM52)
    assert ev.verdict.go
    assert ev.exports()["serve_command"] == ("vllm serve zai-org/GLM-5.2 --tensor-parallel-size 8 "
                                             "--pipeline-parallel-size 4 --max-model-len 131072 "
                                             "--kv-cache-dtype bfloat16")
    default = import_launcher("python3 -m sglang.launch_server --model-path m --pp-size 2", GLM52,
                              Plan(model="glm-5.2"))
    ev = evaluate(default.plan, GLM52)
    assert default.plan.engine == "sglang" and ev.check.partition_source == "default"
    assert [s.num_layers for s in ev.stage_plan.stages] == [39, 39]


def test_vllm_reads_its_command_line_as_its_flexible_parser_does():
    """vLLM's ``FlexibleArgumentParser`` (vllm/utils/argparse_utils.py @ c836a6fe): ``_`` in an option's
    name is ``-``; ``--json-arg.key value`` builds the JSON option (recipes write
    ``--speculative-config.method mtp``), merged per option and placed last, so it wins over the
    option given whole; ``-q`` is ``--quantization`` (vllm/engine/arg_utils.py @ 99d7eb5d)."""
    got = parse_serve_launcher("vllm serve m --tensor_parallel_size 4 --pipeline_parallel_size=2 -q fp8 "
                               "--speculative-config.method mtp --speculative_config.num_speculative_tokens=1\n")
    assert (got.tp, got.pp, got.weight_dtype, got.mtp) == (4, 2, "fp8", True)
    assert got.provenance["mtp_layers"].line == 1
    whole_then_dotted = parse_serve_launcher(
        "vllm serve m --speculative-config.method ngram --speculative-config '{\"method\": \"mtp\"}'\n")
    assert not whole_then_dotted.mtp   # the dotted value is appended last: ngram wins
    assert any("ngram" in w for w in whole_then_dotted.warnings)


SERVE_YAML = """\
# vLLM serve options
tensor_parallel_size: 4
pipeline-parallel-size: 2
enable-expert-parallel: true
enforce-eager: false
max-model-len: 65536
"""


def test_a_vllm_config_file_is_read_as_vllm_pulls_it_in(tmp_path):
    """``vllm serve MODEL --config FILE`` (vllm/utils/argparse_utils.py @ c836a6fe): the file's flat
    mapping becomes options placed after the model and before the rest of the command line, so
    the command line wins (``-tp 8`` over the file's 4); ``true`` is a switch, ``false`` nothing; a
    relative path is beside the launcher; pasted or from disk alike."""
    launch = "vllm serve zai-org/GLM-5.2 --config serve.yaml -tp 8\n"
    pasted = import_launcher(launch, GLM52, Plan(model="glm-5.2"), files={"serve.yaml": SERVE_YAML})
    (tmp_path / "serve.yaml").write_text(SERVE_YAML)
    (tmp_path / "run.sh").write_text(launch)
    on_disk = import_launcher(launch, GLM52, Plan(model="glm-5.2"), path=str(tmp_path / "run.sh"))
    for got in (pasted, on_disk):
        assert (got.plan.tp, got.plan.pp, got.plan.ep, got.plan.context) == (8, 2, 8, 65536)
        values = got.report["values"]
        assert (values["pp"]["line"], values["ep"]["line"], values["context"]["line"]) == (3, 4, 6)
        assert values["pp"]["file"].endswith("serve.yaml") and values["tp"]["line"] == 1
    # the file alone, the model in it (--model), no model on the command line
    alone = import_launcher("vllm serve --config c.yml\n", GLM52, Plan(model="glm-5.2"),
                            files={"c.yml": "model: zai-org/GLM-5.2\ntensor-parallel-size: 2\n"})
    assert (alone.plan.tp, alone.report["serve"]["model"]) == (2, "zai-org/GLM-5.2")


@pytest.mark.parametrize(("files", "match"), [
    ({}, "serve.yaml: vLLM reads further options from that YAML file, which is not in the text"),
    ({"serve.yaml": "- a\n- b\n"}, "is not one mapping of options"),
    ({"serve.yaml": "speculative-config:\n  method: mtp\n"}, "speculative-config in serve.yaml is a mapping"),
    ({"serve.yaml": "tp: [\n"}, "--config serve.yaml: not YAML vLLM can read"),
])
def test_a_vllm_config_file_that_cannot_be_read_is_refused(files, match):
    with pytest.raises(Exception, match=match):
        import_launcher("vllm serve m --config serve.yaml\n", GLM52, Plan(model="glm-5.2"), files=files)
    with pytest.raises(ServeLauncherError, match="given twice"):
        parse_serve_launcher("vllm serve m --config a.yaml --config b.yaml\n")
    with pytest.raises(ServeLauncherError, match="only as YAML"):
        parse_serve_launcher("vllm serve m --config a.json\n", loader=lambda p: "{}")


def test_an_sglang_config_file_is_merged_first_as_sglang_merges_it():
    """SGLang's ``ConfigArgumentMerger`` (server_args_config_parser.py @ 7ef0fc26) puts the file's
    options before the whole command line (the command line wins); a switch set ``true`` is the
    switch; a key spelled with ``_`` for an option read here is refused (its options have dashes)."""
    yaml_text = "tp-size: 4\npp-size: 2\nenable-dp-attention: true\ndp-size: 2\ncontext-length: 32768\n"
    got = import_launcher("python -m sglang.launch_server --config s.yaml --model-path m --tp 8\n", GLM52,
                          Plan(model="glm-5.2"), files={"s.yaml": yaml_text})
    assert (got.plan.tp, got.plan.pp, got.plan.dp, got.plan.enable_dp_attention, got.plan.context) == (
        8, 2, 2, True, 32768)
    assert got.report["values"]["pp"]["line"] == 2 and got.report["values"]["tp"]["line"] == 1
    with pytest.raises(Exception, match="SGLang's option is --tp-size; write the key with dashes"):
        import_launcher("python -m sglang.launch_server --model-path m --config s.yaml\n", GLM52,
                        Plan(model="glm-5.2"), files={"s.yaml": "tp_size: 4\n"})


def test_a_config_option_joined_with_equals_is_not_pulled_in():
    """Both engines pull a file in only after the word ``--config`` (vLLM ``"--config" in args``,
    SGLang ``arg == "--config"``); ``--config=FILE`` is not pulled in, so its file's settings do not
    apply (said)."""
    for line in ("vllm serve m -tp 2 --config=serve.yaml\n",
                 "python -m sglang.launch_server --model-path m --tp 2 --config=serve.yaml\n"):
        got = parse_serve_launcher(line, loader=lambda p: "tensor-parallel-size: 8\ntp-size: 8\n")
        assert got.tp == 2
        assert any("--config=serve.yaml" in w and "does not read this one" in w for w in got.warnings)


@pytest.mark.parametrize("flag", ["--decode-context-parallel-size 8", "-dcp 8", "--decode_context_parallel_size=8",
                                  "-pcp 2"])
def test_vllm_context_parallelism_is_said_not_silently_dropped(flag):
    """Decode / prefill context parallelism spreads a sequence's cached tokens over the TP group;
    no plan field carries it, so the import says the caches are judged whole per TP rank."""
    got = parse_serve_launcher(f"vllm serve m -tp 8 {flag}\n")
    assert got.tp == 8
    assert [w.split(" (")[0].split()[0] for w in got.warnings if "an upper bound" in w] == [
        flag.split()[0].split("=")[0].replace("_", "-")]


@pytest.mark.parametrize("flag", ["--attn-cp-size 2", "--attention-context-parallel-size 2",
                                  "--enable-nsa-prefill-context-parallel", "--enable-dsa-prefill-context-parallel"])
def test_sglang_context_parallelism_is_said_not_silently_dropped(flag):
    """SGLang's attention context parallelism narrows the attention TP (tp // dp // cp) and its
    DSA prefill context parallelism may switch DP attention on; no plan field carries either."""
    got = parse_serve_launcher(f"python -m sglang.launch_server --model-path m --tp 8 {flag}\n")
    assert [w.split(" (")[0] for w in got.warnings if "not a plan setting" in w] == [flag]


def test_a_config_file_of_aliases_is_refused_before_it_is_written_out():
    """A few lines of YAML aliases stand for billions of values; turning them into options would
    write them all out, so a config file holding more than 10,000 (aliases expanded) is refused."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]" for k in range(1, 9)]
    bomb = "\n".join(lines) + "\n"
    for launch in ("vllm serve m --config c.yaml\n", "python -m sglang.launch_server --model-path m --config c.yaml\n"):
        with pytest.raises(ServeLauncherError, match="more than 10,000 values"):
            parse_serve_launcher(launch, loader=lambda p: bomb)


def test_a_quantized_checkpoints_name_beside_bf16_weights_is_said():
    """SGLang's GLM-5 recipe serves ``zai-org/GLM-5-FP8``; judged on a config without a
    quantization_config the weights are BF16 - the import says so (no verdict changes on a name);
    a name without such a word, or a launch that states ``--quantization``, says nothing."""
    launch = "python3 -m sglang.launch_server --model-path {} --tp-size 8\n"
    said = import_launcher(launch.format("zai-org/GLM-5-FP8"), GLM52, Plan(model="glm-5.2"))
    assert said.plan.weight_dtype is None
    assert any("zai-org/GLM-5-FP8 (line 1): its name says FP8 weights" in w and "--weight-dtype" in w
               for w in said.warnings)
    for model, extra in (("zai-org/GLM-5", ""), ("zai-org/GLM-5-FP8", " --quantization fp8"), ("my-fp8x", "")):
        quiet = import_launcher(launch.format(model).strip() + extra + "\n", GLM52, Plan(model="glm-5.2"))
        assert not any("its name says" in w for w in quiet.warnings), model


@pytest.mark.parametrize("launch", ["vllm serve m -tp 8 --enable-expert-parallel --num-redundant-experts 32",
                                    "vllm serve m -tp 8 --eplb-config.num_redundant_experts 32",
                                    "python -m sglang.launch_server --model-path m --tp 8 --ep-num-redundant-experts 32"])
def test_redundant_experts_are_said_as_a_lower_bound(launch):
    """EPLB's redundant expert copies add expert weights on every EP rank; no plan field carries
    them, so the memory verdict is a lower bound - said, never silently dropped."""
    got = parse_serve_launcher(launch + "\n")
    assert any("redundant experts" in w and "a lower bound" in w for w in got.warnings), got.warnings
    # --enable-eplb alone keeps vLLM's default of no redundant expert
    assert not parse_serve_launcher("vllm serve m -tp 8 --enable-expert-parallel --enable-eplb\n").warnings


@pytest.mark.parametrize("extra", ["--enable-ep-moe", "--enable-deepep-moe", "--moe-a2a-backend deepep",
                                   "--moe-a2a-backend=mooncake", "--moe-a2a-backend flashinfer",
                                   "--moe-a2a-backend mori", "--moe-a2a-backend nixl", "--moe-a2a-backend pplx",
                                   "--moe-a2a-backend deepep_v2", "--moe-a2a-backend megamoe"])
def test_sglang_backends_that_make_ep_the_tp_size(extra):
    """SGLang sets ``ep_size = tp_size`` for the all-to-all MoE backends that span the TP group
    (``_A2A_EP_SPANNING_BACKENDS``, ``arg_groups/overrides.py`` @ 003bbaf9) and the deprecated
    ``--enable-ep-moe`` / ``--enable-deepep-moe``, whatever ``--ep-size`` says: the launch is read so,
    with the line, and an ``--ep-size`` it overrides is said."""
    got = parse_serve_launcher(f"python -m sglang.launch_server --model-path m --tp 8 {extra}\n")
    assert got.ep == 8 and got.provenance["ep"].line == 1 and not got.warnings
    over = parse_serve_launcher(f"python -m sglang.launch_server --model-path m --tp 8 --ep-size 2 {extra}\n")
    assert over.ep == 8
    assert any("overridden" in w and "expert parallel size 2" in w for w in over.warnings), over.warnings
    same = parse_serve_launcher(f"python -m sglang.launch_server --model-path m --tp 8 --ep-size 8 {extra}\n")
    assert same.ep == 8 and not same.warnings


def test_sglang_other_a2a_backends_keep_the_ep_size():
    """A backend that does not span the TP group (``none``, ``ascend_tp``) keeps ``--ep-size`` (or its
    newer alias ``--ep``), 1 without it."""
    assert parse_serve_launcher("python -m sglang.launch_server --model-path m --tp 8 --moe-a2a-backend none\n").ep == 1
    assert parse_serve_launcher("python -m sglang.launch_server --model-path m --tp 8 --ep 4 "
                                "--moe-a2a-backend ascend_tp\n").ep == 4
    with pytest.raises(ServeLauncherError, match=r"--moe-a2a-backend .* cannot be resolved"):
        parse_serve_launcher("python -m sglang.launch_server --model-path m --tp 8 --moe-a2a-backend $(pick)\n")
