"""MaxText's circular pipeline: (stage, repeat) blocks, MaxText's config assertions, and the
index-share pattern of the closed GLM-5.2 PR against the checkpoint's ``indexer_types``.

Expected layers and counts are derived here from the preset's JSON and the stated MaxText rule
(stage s, repeat r holds g0 + r*S*Lps + s*Lps + [0, Lps), 0-based).
"""

from __future__ import annotations

import json

import pytest

from app.core.engines.maxtext import (
    MaxTextPipeline,
    maxtext_check,
)
from app.core.model.config import load_model
from app.core.plan import PlanError, strict_plan, unknown_keys
from app.core.reports import check_report
from tests.conftest import REPO

GLM52 = load_model("glm-5.2")
RAW = json.loads((REPO / "app/core/presets/glm-5.2.json").read_text())
FULL0 = {i for i, t in enumerate(RAW["indexer_types"]) if t == "full"}  # 0-based
L = RAW["num_hidden_layers"]


def expected_blocks(g0: int, s: int, lps: int, repeats: int) -> list[tuple[int, int, int]]:
    """(stage, repeat, first 0-based layer) in vp-major order."""
    return [(st, r, g0 + r * s * lps + st * lps) for r in range(repeats) for st in range(s)]


def test_s4_64_layers_lps4_is_valid():
    # pipeline_parallel_layers 64 with the DeepSeek block: the 78 - 64 = 14 layers before it (3 dense
    # + 11 MoE) run outside the pipeline, so g0 = 14 (0-based), i.e. layer 15 1-based, which is full.
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4,
                                             pipeline_parallel_layers=64))
    repeats = 64 // (4 * 4)
    blocks = expected_blocks(78 - 64, 4, 4, repeats)
    assert all(first in FULL0 for _, _, first in blocks)  # the fixture: every start is full
    assert r.valid, r.to_json()
    assert [(s.pp_rank, s.vp_stage, s.first_layer - 1) for s in r.plan.stages] == blocks
    assert r.layout is not None and r.layout.repeats == 4 and r.layout.microbatches == 4
    assert r.to_json()["layout"]["layers_outside_pipeline"] == [1, 14]
    assert "pipeline_parallel_layers=64" in r.to_json()["config_overrides"]


def test_s3_with_75_layers_is_invalid():
    # 75 = the MoE layers (78 - first_k_dense_replace 3), MaxText's default pipeline_parallel_layers for
    # the DeepSeek block; 75 / (3 stages * 1 layer) = 25 repeats. The pipeline starts at 0-based layer 3
    # (1-based 4), a shared layer whose source (layer 3, 1-based) runs before the pipeline: only the
    # activations enter it. With one layer per stage every pipelined layer starts a (stage, repeat),
    # so every shared layer from 4 on is a violation.
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=3))
    assert r.layout is not None and (r.layout.num_stages, r.layout.repeats) == (3, 25)
    shared_pipelined = [i + 1 for i in range(3, L) if i not in FULL0]
    assert len(shared_pipelined) == 57
    assert not r.valid and not r.errors
    assert [v.layer for v in r.boundary.violations] == shared_pipelined
    # more layers per stage do not help: every start is 4 + 5k or 4 + 25k, and layer 4 is shared
    for lps in (5, 25):
        r2 = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=3, num_layers_per_pipeline_stage=lps))
        assert r2.boundary.violations and r2.boundary.violations[0].layer == 4


@pytest.mark.parametrize("settings", [
    {},
    {"num_layers_per_pipeline_stage": 5},   # pipelined, its 15 repeats would start on 4, 9, 14, ...: shared
    {"num_layers_per_pipeline_stage": 4, "pipeline_parallel_layers": 64, "num_pipeline_repeats": 7},  # 4*7 != 64
    {"num_pipeline_microbatches": 3, "pipeline_delay_activation_forwarding": True},
])
def test_one_stage_is_no_pipeline_and_reads_no_pipeline_setting(settings):
    """MaxText pipelines only when ici x dcn pipeline parallelism is above 1 (``types.py``
    ``using_pipeline_parallelism``); otherwise the decoder runs the 78 layers in order on every device.
    No (stage, repeat) boundary exists, so none of the pipeline settings is derived or asserted: one
    stage, layers 1-78, starting on layer 1 (full in the checkpoint), and a warning that says so."""
    r = maxtext_check(GLM52, MaxTextPipeline(**settings))
    assert 0 in FULL0
    assert [(s.pp_rank, s.vp_stage, s.first_layer, s.last_layer) for s in r.plan.stages] == [(0, 0, 1, L)]
    assert r.valid and not r.errors and not r.boundary.violations and r.layout is None
    assert any("MaxText does not pipeline" in w for w in r.warnings)
    # two stages over DCN do pipeline: MaxText's rules apply again (75 MoE layers / (2 x 1) leaves 1)
    two = maxtext_check(GLM52, MaxTextPipeline(dcn_pipeline_parallelism=2, **settings))
    assert not two.valid and not any("does not pipeline" in w for w in two.warnings)


def test_fsss_from_layer_zero_against_the_checkpoint():
    fsss = {i for i in range(L) if i % 4 == 0}
    diffs = sorted(i + 1 for i in fsss ^ FULL0)
    assert len(fsss) == 20 and len(FULL0) == 21 and len(diffs) == 39
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4,
                                             pipeline_parallel_layers=64), "FSSS")
    assert list(r.differences) == diffs
    err = [e for e in r.errors if e.code == "pattern_mismatch"]
    assert err and "39 of 78 layers" in err[0].message
    assert err[0].message.endswith(
        f"{', '.join(map(str, diffs))} (1-based); MaxText would run the indexer on layers whose weights the "
        "checkpoint does not have, or skip it where it does")
    # and under MaxText's own FSSS roles the starts 15, 19, ... (1-based) are shared layers
    assert [v.layer for v in r.boundary.violations][:3] == [15, 19, 23]
    assert not r.valid


def test_matching_pattern_has_no_differences():
    letters = "".join("F" if i in FULL0 else "S" for i in range(L))
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4,
                                             pipeline_parallel_layers=64), letters)
    assert r.valid and not r.differences


@pytest.mark.parametrize("pipeline,code,text", [
    (MaxTextPipeline(ici_pipeline_parallelism=4), "repeats_divisibility",
     ("The number of layers per stage (1) times the number of stages (4) must divide the number of "
      "pipeline_parallel_layers which defaults to decoder layers (75)")),
    (MaxTextPipeline(ici_pipeline_parallelism=2, dcn_pipeline_parallelism=2, num_layers_per_pipeline_stage=4,
                     pipeline_parallel_layers=64, num_pipeline_repeats=2), "pipeline_product",
     ("The product of pipeline stages (4), repeats (2), and layers per stage (4) must be equal to "
      "pipeline_parallel_layers which defaults to decoder layers (64)")),
    (MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4, pipeline_parallel_layers=64,
                     num_pipeline_microbatches=6), "microbatches_divisibility",
     "The number of microbatches (6) must be divisible by the number of stages (4)"),
    (MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4, pipeline_parallel_layers=64,
                     num_pipeline_microbatches=4, pipeline_delay_activation_forwarding=True), "delay_microbatches",
     ("Delayed activation forwarding requires at least 2 * num_stages microbatches, but 4 stages are used "
      "with 4 microbatches")),
    (MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4, pipeline_parallel_layers=64,
                     micro_batch_size_to_train_on=6), "microbatch_size",
     "The batch size for a single forward pass (6) must be divisible by the number of microbatches (4)"),
    (MaxTextPipeline(ici_pipeline_parallelism=2, pipeline_parallel_layers=76), "pipeline_parallel_layers",
     "pipeline_parallel_layers 76 must be between 1 and 75"),
])
def test_maxtext_assertions_are_acceptance_errors(pipeline, code, text):
    r = maxtext_check(GLM52, pipeline)
    assert not r.valid
    found = [e for e in r.errors if e.code == code]
    assert found and text in found[0].message


def test_delay_doubles_the_default_microbatches():
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4,
                                             pipeline_parallel_layers=64, pipeline_delay_activation_forwarding=True))
    assert r.layout is not None and r.layout.microbatches == 8 and r.valid


def test_other_blocks_pipeline_from_layer_one_and_check_the_layer_after():
    # decoder_block other: g0 = 0; pipelined layers 1..64, the rest (65..78) after the pipeline
    r = maxtext_check(GLM52, MaxTextPipeline(ici_pipeline_parallelism=4, num_layers_per_pipeline_stage=4,
                                             pipeline_parallel_layers=64, decoder_block="other"))
    assert [s.first_layer for s in r.plan.stages][:4] == [1, 5, 9, 13]
    assert (64 not in FULL0) and any(e.code == "after_pipeline_start" for e in r.errors)


def _maxtext_check(**query: str) -> dict:
    """The body of ``isplan check --engine maxtext`` / ``/api/v1/check`` for a MaxText plan query."""
    return check_report(strict_plan({"model": "glm-5.2", "engine": "maxtext", **query}), GLM52).body


def test_report_rejects_unknown_keys_and_bad_values():
    body = _maxtext_check(ici_pipeline_parallelism="4", layers_per_pipeline_stage="4", pipeline_parallel_layers="64")
    assert body["valid"] and {"valid", "stages", "violations", "errors"} <= set(body)
    assert body["stages"][1]["stage_index"] == 1 and body["stages"][4]["repeat"] == 1
    # an unknown key is a problem naming it (the page's query reader; the CLI's parser refuses the flag)
    problems = unknown_keys(["ici_pipeline_parallelism", "pipeline_stages"])
    assert [p.field for p in problems] == ["pipeline_stages"]
    assert "unknown setting 'pipeline_stages'" in problems[0].message
    with pytest.raises(PlanError, match="ici_pipeline_parallelism"):
        _maxtext_check(ici_pipeline_parallelism="0")
    with pytest.raises(PlanError, match="index_share_pattern"):
        _maxtext_check(pattern="FSXS", ici_pipeline_parallelism="2")


def test_a_bad_index_share_pattern_is_a_problem_of_the_pattern_field():
    """A letter other than F/S is MaxText's index_share_pattern being unusable: the field that fixes
    it is the pattern, not the pipeline's layers per stage."""
    from app.core.evaluate import evaluate

    plan = strict_plan({"model": "glm-5.2", "engine": "maxtext", "ici_pipeline_parallelism": "4", "pattern": "FSXS"})
    ev = evaluate(plan, load_model("glm-5.2"))
    assert [(p.field, p.message) for p in ev.problems] == [
        ("pattern", "index_share_pattern may only contain F and S; found 'X'")]
