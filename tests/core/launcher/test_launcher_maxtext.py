"""Reading MaxText launches: ``python3 -m maxtext.trainers.pre_train.train CONFIG.yml key=value``,
with MaxText's own precedence (config file < command line < ``M_<KEY>``; pyconfig.py @ e591f30c)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.evaluate import evaluate
from app.core.launcher import import_launcher
from app.core.launcher.importer import LauncherImportError
from app.core.model.config import load_model
from app.core.plan import Plan

GLM52 = load_model("glm-5.2")
BASE = Plan(model="glm-5.2")
MAXTEXT_REPO = Path(os.environ.get("ISPLAN_MAXTEXT_REPO", "/work/.mirror/AI-Hypercomputer+maxtext/repo"))

#: plan field -> MaxText key (written independently of the engine's vocabulary: MaxText's base.yml names)
KEYS = {"ici_pipeline_parallelism": "ici_pipeline_parallelism", "dcn_pipeline_parallelism": "dcn_pipeline_parallelism",
        "layers_per_pipeline_stage": "num_layers_per_pipeline_stage", "num_pipeline_repeats": "num_pipeline_repeats",
        "pipeline_parallel_layers": "pipeline_parallel_layers", "num_microbatches": "num_pipeline_microbatches"}


def _import(script: str, **kw):
    return import_launcher(script, GLM52, BASE, **kw)


@settings(max_examples=120, deadline=None)
@given(ici=st.sampled_from([1, 2, 3, 4]), dcn=st.sampled_from([1, 2]), lps=st.integers(1, 6),
       repeats=st.sampled_from([None, 1, 2, 5]), layers=st.sampled_from([None, 60, 72, 75]),
       micro=st.sampled_from([None, 4, 8, 16]), where=st.lists(st.sampled_from(["cli", "env", "yml"]),
                                                               min_size=6, max_size=6))
def test_a_launch_is_the_plan_its_keys_say(ici, dcn, lps, repeats, layers, micro, where):
    """Differential: the same MaxText settings written on the command line, as ``M_`` variables or in
    a config file (any mix) import as the plan those settings are, and get that plan's verdict."""
    want = replace(BASE, engine="maxtext", ici_pipeline_parallelism=ici, dcn_pipeline_parallelism=dcn,
                   layers_per_pipeline_stage=lps, num_pipeline_repeats=repeats, pipeline_parallel_layers=layers,
                   num_microbatches=micro)
    cli, env, yml = [], [], ['base_config: "base.yml"']
    for (field, key), place in zip(KEYS.items(), where, strict=True):
        value = getattr(want, field)
        text = "-1" if value is None else str(value)
        {"cli": cli, "env": env, "yml": yml}[place].append(
            f"{key}={text}" if place == "cli" else f"export M_{key.upper()}={text}" if place == "env"
            else f"{key}: {text}")
    script = "\n".join(env + ["python3 -m maxtext.trainers.pre_train.train configs/run.yml run_name=x "
                              + " ".join(cli)]) + "\n"
    got = _import(script, files={"configs/run.yml": "\n".join(yml) + "\n"}, main="launch.sh")
    fields = tuple(KEYS)
    assert tuple(getattr(got.plan, f) for f in fields) == tuple(getattr(want, f) for f in fields)
    assert got.plan.engine == "maxtext"
    assert evaluate(got.plan, GLM52).verdict.to_dict() == evaluate(want, GLM52).verdict.to_dict()


@pytest.mark.parametrize("script", [
    "python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml ici_pipeline_parallelism=3 "
    "num_layers_per_pipeline_stage=5\n",
    "python3 -m MaxText.train MaxText/configs/base.yml ici_pipeline_parallelism=3 num_layers_per_pipeline_stage=5\n",
    "python3 MaxText/train.py MaxText/configs/base.yml ici_pipeline_parallelism=3 num_layers_per_pipeline_stage=5\n",
    "python3 -m maxtext.trainers.pre_train.train ici_pipeline_parallelism=3 num_layers_per_pipeline_stage=5\n",
    'N=5\nxpk workload create --cluster c --workload w --tpu-type v5p-128 --command "python3 -m '
    'maxtext.trainers.pre_train.train src/maxtext/configs/base.yml ici_pipeline_parallelism=3 '
    'num_layers_per_pipeline_stage=$N"\n',
    "M_NUM_LAYERS_PER_PIPELINE_STAGE=5 python3 -m maxtext.trainers.pre_train.train base.yml "
    "ici_pipeline_parallelism=3\n",
    'CMD="python3 -m maxtext.trainers.pre_train.train base.yml ici_pipeline_parallelism=3"\n'
    "CMD+=' num_layers_per_pipeline_stage=5'\n$CMD\n",
])
def test_every_launch_form(script):
    """The current module, the pre-2026-04 module and script, no config argument (base.yml), an xpk
    workload's --command, an M_ variable set for the command, a command kept in a variable: each
    reads 3 stages of 5 layers."""
    got = _import(script)
    assert (got.plan.engine, got.plan.ici_pipeline_parallelism, got.plan.layers_per_pipeline_stage) == (
        "maxtext", 3, 5)
    assert got.report["values"]["ici_pipeline_parallelism"]["value"] == "3"
    assert got.report["engine"]["name"] == "maxtext"


def test_what_maxtext_refuses_or_the_reader_cannot_know():
    with pytest.raises(LauncherImportError, match="overridden by both CLI/kwargs and environment variable "
                                                  "'M_ICI_PIPELINE_PARALLELISM'"):
        _import("export M_ICI_PIPELINE_PARALLELISM=2\npython3 -m maxtext.trainers.pre_train.train base.yml "
                "ici_pipeline_parallelism=4\n")
    with pytest.raises(LauncherImportError, match=r"num_pipeline_microbatches=\$MB cannot be resolved"):
        _import("python3 -m maxtext.trainers.pre_train.train base.yml num_pipeline_microbatches=$MB\n")
    with pytest.raises(LauncherImportError, match="is not a whole number"):
        _import("python3 -m maxtext.trainers.pre_train.train base.yml ici_pipeline_parallelism=four\n")
    with pytest.raises(LauncherImportError, match=r"cannot read the MaxText config 'configs/mine\.yml'"):
        _import("python3 -m maxtext.trainers.pre_train.train configs/mine.yml\n")
    with pytest.raises(LauncherImportError, match="2 MaxText commands"):
        _import("python3 -m maxtext.trainers.pre_train.train base.yml\npython3 -m MaxText.train base.yml\n")
    with pytest.raises(LauncherImportError, match="ici_pipeline_parallelism"):
        _import("python3 -m maxtext.trainers.pre_train.train base.yml ici_pipeline_parallelism=-1\n")
    aliases = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 10)}]\n" for k in range(1, 9))
    for text, said in (("a: [1\n", "not YAML MaxText can read"), ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                       (aliases + "ici_pipeline_parallelism: *a8\n", "ici_pipeline_parallelism is a list, not a whole"),
                       (aliases + "base_config: *a8\n", "base_config is a list, not a file name")):
        with pytest.raises(LauncherImportError, match=said):
            _import("python3 -m maxtext.trainers.pre_train.train c.yml\n", files={"c.yml": text}, main="r.sh")
    # words the reader cannot know may hold keys: refused, never read as "no pipeline"
    with pytest.raises(LauncherImportError, match=r"\$EXTRA cannot be resolved .*it may set MaxText keys"):
        _import("python3 -m maxtext.trainers.pre_train.train base.yml $EXTRA\n")
    with pytest.raises(LauncherImportError, match=r"\$CMD runs MaxText but cannot be read completely"):
        _import('CMD="python3 -m maxtext.trainers.pre_train.train base.yml $EXTRA"\n$CMD\n')


def test_what_the_import_says():
    got = _import("M_DCN_PIPELINE_PARALLELISM=2\npython3 -m maxtext.trainers.pre_train.train base.yml "
                  "model_name=deepseek3-671b num_pipeline_repeats=-1 dcn_pipeline_parallelism=4\n")
    assert got.plan.dcn_pipeline_parallelism == 4 and got.plan.num_pipeline_repeats is None
    assert any("M_DCN_PIPELINE_PARALLELISM is assigned" in w and "never exported" in w for w in got.warnings)
    assert any(w.startswith("model_name=deepseek3-671b") for w in got.warnings)


def test_a_config_chain_is_read_from_the_pasted_files_and_the_command_line_wins():
    files = {"cfg/a.yml": "base_config: b.yml\nnum_layers_per_pipeline_stage: 5\n",
             "cfg/b.yml": "base_config: base.yml\nici_pipeline_parallelism: 3\nnum_layers_per_pipeline_stage: 1\n"}
    got = _import("python3 -m maxtext.trainers.pre_train.train cfg/a.yml dcn_pipeline_parallelism=1\n",
                  files=files, main="run.sh")
    assert (got.plan.ici_pipeline_parallelism, got.plan.layers_per_pipeline_stage) == (3, 5)
    over = _import("python3 -m maxtext.trainers.pre_train.train cfg/a.yml num_layers_per_pipeline_stage=25\n",
                   files=files, main="run.sh")
    assert over.plan.layers_per_pipeline_stage == 25
    assert over.report["values"]["ici_pipeline_parallelism"]["file"] == "cfg/b.yml"


def test_other_launches_are_not_maxtext():
    """A slime train.py and a vLLM server keep their own consumers."""
    from tests.cli.test_cli import SLIME_GLM52

    assert import_launcher(SLIME_GLM52, GLM52, BASE).plan.engine == "slime"
    assert import_launcher("vllm serve m -tp 8\n", GLM52, BASE).plan.engine == "vllm"


@pytest.mark.skipif(not MAXTEXT_REPO.is_dir(), reason="no local MaxText snapshot (ISPLAN_MAXTEXT_REPO)")
def test_maxtexts_own_launch_scripts_are_read_or_refused_by_name(tmp_path):
    """Every shell script in MaxText's repository that launches its trainer is a plan (MaxText's
    config keys read) or a named refusal - never a crash."""
    names = subprocess.run(["git", "-C", str(MAXTEXT_REPO), "grep", "-l", "pre_train.train", "HEAD", "--", "*.sh"],
                           capture_output=True, text=True, check=False).stdout.split()
    assert names, "no launch script found"
    read = 0
    for name in names:
        rev_path = name.split(":", 1)[1]
        text = subprocess.run(["git", "-C", str(MAXTEXT_REPO), "show", f"HEAD:{rev_path}"], capture_output=True,
                              text=True, check=True).stdout
        try:
            got = import_launcher(text, GLM52, BASE)
        except LauncherImportError as exc:
            assert str(exc), rev_path
            continue
        read += 1
        assert got.plan.engine == "maxtext", rev_path
    assert read, "every script was refused"


JOBSET = """apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
spec:
  replicatedJobs:
  - name: workers
    template:
      spec:
        template:
          spec:
            containers:
            - name: maxtext
              command: ["bash", "-c", "python3 -m maxtext.trainers.pre_train.train base.yml ici_pipeline_parallelism=3"]
              env:
              - name: M_NUM_LAYERS_PER_PIPELINE_STAGE
                value: "5"
"""
POD = """containers:
- name: maxtext
  command:
  - python3
  - -m
  - maxtext.trainers.pre_train.train
  args:
  - src/maxtext/configs/base.yml
  - ici_pipeline_parallelism=3
  env:
  - name: M_NUM_LAYERS_PER_PIPELINE_STAGE
    value: "5"
"""


@pytest.mark.parametrize(("spec", "lines"), [(JOBSET, (12, 15)), (POD, (9, 12))])
def test_a_kubernetes_spec_is_read_like_a_script(spec, lines):
    """A JobSet's ``bash -c`` script and a pod's command / args words, with the ``M_`` variable of the
    spec's env list; each value keeps the line it is written on."""
    got = _import(spec, files={"job.yaml": spec}, main="job.yaml")
    assert (got.plan.engine, got.plan.ici_pipeline_parallelism, got.plan.layers_per_pipeline_stage) == (
        "maxtext", 3, 5)
    values = got.report["values"]
    assert (values["ici_pipeline_parallelism"]["line"], values["num_layers_per_pipeline_stage"]["line"]) == lines
    assert values["num_layers_per_pipeline_stage"]["how"] == "env"


def test_the_check_json_carries_the_launcher_report(tmp_path):
    """``isplan check --launcher --format json`` holds the import's report for a MaxText and a serving
    launch as it does for a Megatron one."""
    from tests.cli.test_cli import isplan

    for text, key in (("python3 -m maxtext.trainers.pre_train.train base.yml ici_pipeline_parallelism=3 "
                       "num_layers_per_pipeline_stage=5\n", "values"), ("vllm serve m -tp 8\n", "serve")):
        script = tmp_path / "run.sh"
        script.write_text(text)
        p = isplan("check", "glm-5.2", "--launcher", str(script), "--format", "json")
        assert p.returncode in (0, 1), p.stderr
        assert key in json.loads(p.stdout)["launcher"], text
