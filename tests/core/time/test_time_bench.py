"""``python -m bench steptime``'s method: each row becomes exactly the ``isplan time`` command a user
types, the held-out runs are split once into development and a locked test set with no launch on
both sides, and the product path and the direct path agree when given the same settings."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from app.cli import build_parser
from bench.steptime import (
    CALIBRATION,
    HOLDOUT,
    SPLIT_KEY,
    argv_for,
    load_rows,
    model_for,
    plan_for,
    predict_product,
    settings_for,
    split_holdout,
    undisputed,
)

#: issue 18's inputs: exactly these flags (plus the model, --gpu, --precision and --format)
ALLOWED = {"--tp", "--pp", "--cp", "--vpp", "--ep", "--etp", "--dp", "--mbs", "--global-batch", "--seq-length", "--sp",
           "--recompute", "--recompute-method", "--recompute-num-layers", "--recompute-modules", "--mtp-layers",
           "--layout", "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather", "--gpu", "--precision",
           "--format"}


def _key(row: dict) -> str:
    return "|".join(str(row.get(k)) for k in SPLIT_KEY)


def test_the_split_is_fixed_and_keeps_a_launch_on_one_side() -> None:
    rows = load_rows(HOLDOUT)
    dev, test = split_holdout(rows)
    assert (len(dev), len(test)) == (104, 56)
    assert sorted(r["id"] for r in dev + test) == sorted(r["id"] for r in rows)
    assert not {_key(r) for r in dev} & {_key(r) for r in test}
    # a third of each GPU's launch configurations (positions 1, 4, 7, ... by SHA-256): every system is tested
    assert set(Counter(r["gpu"] for r in test)) == set(Counter(r["gpu"] for r in rows))
    assert split_holdout(list(reversed(rows)))[1] == list(reversed(test))


def test_a_disputed_measurement_is_rare_cited_and_only_set_aside_in_a_second_summary() -> None:
    """Two development rows are disputed, each with its evidence; where the file holds the same
    launch from another container (26.02 against 26.02.01), the two measurements differ by > 1.5x
    though every stated setting is equal. ``undisputed`` drops exactly the marked rows."""
    rows = load_rows(HOLDOUT)
    dev = split_holdout(rows)[0]
    marked = [r for r in rows if r.get("disputed")]
    assert len(marked) == 2 and all(r in dev for r in marked)
    assert all("performance-summary" in r["disputed"] for r in marked)
    for r in marked:
        twins = [o for o in rows if _key(o) == _key(r) and o is not r and not o.get("disputed")]
        for o in twins:
            assert o["measured"]["tokens_per_s_per_gpu"] / r["measured"]["tokens_per_s_per_gpu"] > 1.5
    regression = next(r for r in marked if r["container"] == "26.02")
    assert [o["container"] for o in rows if _key(o) == _key(regression) and o is not regression] == ["26.02.01"]
    assert undisputed(dev) == [r for r in dev if r not in marked]


@pytest.mark.parametrize("row", load_rows(CALIBRATION) + load_rows(HOLDOUT)[::17], ids=lambda r: r["id"][:60])
def test_every_row_is_a_command_a_user_types(row: dict) -> None:
    argv = argv_for(row)
    assert argv[0] == "time"
    flags = {a for a in argv[2:] if a.startswith("--")}
    assert flags <= ALLOWED, flags - ALLOWED
    assert ("--layout" in flags) == (row.get("layout") not in (None, "auto"))
    assert ("--vpp" in flags) == bool(row.get("vp"))
    build_parser().parse_args(argv)  # argparse accepts it as typed


@pytest.mark.parametrize("row", load_rows(CALIBRATION), ids=lambda r: r["id"][:60])
def test_the_two_paths_agree_on_the_same_settings(row: dict) -> None:
    """The direct path given the product's defaults for what the flags cannot say (no EP overlap,
    the flex dispatcher, BF16 attention and output layer, no CUDA graph) times the row as
    ``isplan time`` does."""
    from app.core.engines import role_rule
    from app.core.model.hardware import get_hardware
    from app.core.model.roles import derive_roles
    from app.core.time import step_time

    cfg = model_for(row["model"])
    s = replace(settings_for(row), ep_comm_overlap=False, moe_dispatcher="flex", fp8_attention=False,
                fp8_output_proj=False, cuda_graph="none")
    direct = step_time(cfg, derive_roles(cfg, role_rule("megatron")), plan_for(cfg, row), s, get_hardware(row["gpu"]))
    product = predict_product(row)
    assert product["step_seconds"] == pytest.approx(direct.step_seconds, rel=1e-9)
