"""``isplan time`` and the page say how far to trust a step time: the held-out error of the plan's
GPU generation and precision (``app.core.time.accuracy``), counted here from the published runs'
own files, not from the table the product reads."""

from __future__ import annotations

import json

from app.core.model.hardware import get_hardware
from app.core.time.accuracy import MIN_RUNS, accuracy_for, accuracy_table
from bench.steptime import development_rows


def _runs_on(generation: str, precision: str | None = None, model: str | None = None) -> int:
    """Held-out runs whose flags ``isplan time`` takes, counted from the benchmark's row files."""
    dev, test = development_rows()
    return sum(1 for r in dev + test if get_hardware(r["gpu"]).generation == generation
               and (precision is None or r["precision"] == precision) and (model is None or r["model"] == model))


def test_a_plan_quotes_its_generation_and_precision() -> None:
    acc = accuracy_for("hopper", "fp8")
    assert acc is not None and acc["scope"] == "Hopper GPUs in FP8" and acc["validated_here"]
    assert acc["runs"] == _runs_on("hopper", "fp8") >= MIN_RUNS
    assert f"Against {acc['runs']} published runs on Hopper GPUs in FP8" in acc["text"]
    assert acc["short"] == f"typically off by {acc['mean_abs_error']:.0%}"
    assert acc["this_model"] is None and not acc["text"].endswith("this model.")


def test_a_validated_model_hears_its_own_runs_and_another_hears_of_none() -> None:
    llama = accuracy_for("hopper", "fp8", "llama-3.1-70b")
    assert llama is not None and llama["this_model"]["runs"] == _runs_on("hopper", "fp8", "llama-3.1-70b") > 0
    n = llama["this_model"]["runs"]
    assert f"This model's {n} run{'s' if n > 1 else ''} there: off by" in llama["text"]
    assert accuracy_for("hopper", "fp8", "LLAMA-3.1-70B")["this_model"] == llama["this_model"]   # any case
    glm = accuracy_for("hopper", "fp8", "glm-5.2")
    assert glm is not None and glm["this_model"] is None and glm["text"].endswith("None of them is this model.")


def test_too_few_runs_quote_the_generation_and_none_say_so() -> None:
    groups = accuracy_table()["groups"]
    thin = [k for k, g in groups.items() if "/" in k and g["runs"] < MIN_RUNS]
    for key in thin:   # a precision with few runs on its generation: the generation's runs are quoted
        gen, prec = key.split("/")
        acc = accuracy_for(gen, prec)
        assert acc is not None and acc["runs"] == groups[gen]["runs"] and "/" not in acc["scope"]
    acc = accuracy_for("cdna3", "fp8")   # MI300X: no published run
    assert acc is not None and not acc["validated_here"] and _runs_on("cdna3") == 0
    assert acc["text"].startswith("No published run on CDNA 3 GPUs checks the time model")
    assert acc["text"] == acc["text"].strip()   # no model named: no clause, no dangling space
    assert acc["runs"] == sum(g["runs"] for k, g in groups.items() if "/" not in k and k != "all")


def test_isplan_time_and_the_api_carry_it(capsys, client) -> None:
    from app.cli import main

    argv = ["time", "glm-5.2", "--tp", "4", "--pp", "8", "--first", "14", "--last", "16", "--ep", "32", "--etp", "1",
            "--cp", "8", "--sp", "--gpu", "h100-80gb", "--precision", "bf16"]
    assert main([*argv, "--format", "json"]) in (0, 1)   # timed (exit 2 would be untimed); the verdict is not at issue
    want = accuracy_for("hopper", "bf16", "glm-5.2")
    assert json.loads(capsys.readouterr().out)["time"]["accuracy"] == want
    assert main(argv) in (0, 1)
    assert f"  accuracy: {want['text']}" in capsys.readouterr().out.splitlines()
    body = client.get("/api/v1/time?model=glm-5.2&tp=4&split=14,8,8,8,8,8,8,16&ep=32&etp=1&cp=8&sp=1"
                      "&gpu=h100-80gb&precision=bf16").json()
    assert body["time"]["accuracy"] == want
    page = client.get("/?model=glm-5.2&tp=4&split=14,8,8,8,8,8,8,16&ep=32&etp=1&cp=8&sp=1&gpu=h100-80gb"
                      "&precision=bf16").text
    assert 'id="time-accuracy"' in page and want["short"] in page


def test_a_validated_config_under_another_name_hears_its_runs(tmp_path) -> None:
    """The table names each validated model's config by the SHA-256 of its sorted, minified JSON, so
    the same config under any file name (an upload's ``config.json``) or as a preset is that model;
    a path of the validated file's own name matches by its name too."""
    import hashlib
    from pathlib import Path

    from app.core.model.config import load_model
    from app.core.time.accuracy import validated_name

    source = Path(__file__).resolve().parents[3] / "bench" / "steptime_configs" / "GPT-OSS-120B.json"
    raw = json.loads(source.read_text())
    want = hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert accuracy_table()["configs"]["GPT-OSS-120B"] == want
    copy = tmp_path / "config.json"
    copy.write_text(json.dumps(raw, indent=4))
    cfg = load_model(str(copy))
    mine = accuracy_for("blackwell", "bf16", cfg.id, cfg.canonical_sha256)
    assert mine is not None and mine["this_model"] == accuracy_for("blackwell", "bf16", "GPT-OSS-120B")["this_model"]
    assert mine["this_model"]["runs"] == _runs_on("blackwell", "bf16", "GPT-OSS-120B.json") > 0
    assert validated_name("bench/steptime_configs/GPT-OSS-120B.json") == "GPT-OSS-120B"
    preset = load_model("llama-3.1-405b")   # the preset is the validation config's bytes
    assert validated_name(preset.id, preset.canonical_sha256) == "Llama-3.1-405B"
    glm = load_model("glm-5.2")
    assert validated_name(glm.id, glm.canonical_sha256) == "glm-5.2"   # no run: its own name, heard of none
