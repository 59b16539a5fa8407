"""The GPU catalogue: one source for capacities and the time model's rates."""

from __future__ import annotations

import re

import pytest

from app.core.model.hardware import ALIASES, CATALOGUE, get_hardware, with_overrides
from app.core.model.parallelism import GPU_PRESETS, resolve_gpu
from app.core.plan import GPUS

IDS = ("a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb", "b300-288gb", "gb200-186gb", "gb300-288gb",
       "mi300x-192gb")


def test_catalogue_has_every_gpu_of_the_issue() -> None:
    assert tuple(CATALOGUE) == IDS


@pytest.mark.parametrize("gpu", IDS)
def test_capacity_is_vendor_decimal_and_matches_the_id(gpu: str) -> None:
    hw = CATALOGUE[gpu]
    gb = int(re.search(r"(\d+)gb$", gpu).group(1))  # type: ignore[union-attr]
    assert hw.hbm_bytes == gb * 10**9


@pytest.mark.parametrize("gpu", IDS)
def test_every_value_has_a_source_and_is_positive(gpu: str) -> None:
    hw = CATALOGUE[gpu]
    assert hw.bf16_flops > 0 and hw.hbm_bw > 0 and hw.nvlink_bw > 0 and hw.net_bw > 0
    assert hw.nvlink_domain in (8, 72)
    text = " ".join(hw.sources.values())
    for key in ("flops", "hbm", "nvlink", "net"):
        assert any(key in k for k in hw.sources), f"{gpu}: no source for {key}"
    assert "http" in text or "calculon" in text


def test_dense_rates_follow_the_tensor_core_ratios() -> None:
    """Dense FP8 is twice dense BF16 on Hopper and Blackwell (and CDNA3), FP4 twice FP8 on
    Blackwell (B200 / GB200); Blackwell Ultra raises FP4 only; A100 has no FP8."""
    for gpu in ("h100-80gb", "h200-141gb", "b200-180gb", "gb200-186gb", "b300-288gb", "gb300-288gb", "mi300x-192gb"):
        hw = CATALOGUE[gpu]
        assert hw.fp8_flops == pytest.approx(2 * hw.bf16_flops, rel=0.002)
    for gpu in ("b200-180gb", "gb200-186gb"):
        assert CATALOGUE[gpu].fp4_flops == 2 * CATALOGUE[gpu].fp8_flops
    for gpu in ("b300-288gb", "gb300-288gb"):
        assert CATALOGUE[gpu].fp4_flops > 2 * CATALOGUE[gpu].fp8_flops
    with pytest.raises(ValueError, match="no FP8"):
        CATALOGUE["a100-80gb"].peak_flops("fp8")


def test_nvl72_domains_and_network_rates() -> None:
    assert CATALOGUE["gb200-186gb"].nvlink_domain == CATALOGUE["gb300-288gb"].nvlink_domain == 72
    assert CATALOGUE["h100-80gb"].nvlink_domain == 8
    # 400 Gb/s = 50e9 B/s; ConnectX-8 800 Gb/s on B300 / GB300
    assert CATALOGUE["h100-80gb"].net_bw == 50e9
    assert CATALOGUE["gb300-288gb"].net_bw == 100e9
    # NVLink unidirectional = half the printed bidirectional figure (H100 900 GB/s)
    assert CATALOGUE["h100-80gb"].to_dict()["nvlink_gbs_bidirectional"] == 900


def test_memory_model_reads_the_catalogue() -> None:
    assert set(GPU_PRESETS) == set(CATALOGUE)
    for gpu, hw in CATALOGUE.items():
        assert resolve_gpu(gpu).capacity_bytes == hw.hbm_bytes
    assert resolve_gpu("h100").label == "NVIDIA H100 80GB (80e9 bytes)"  # unchanged label
    assert resolve_gpu("gb200").capacity_bytes == 186 * 10**9
    assert set(GPUS) == {*CATALOGUE, "custom"}
    assert resolve_gpu("custom", 123 * 10**9).capacity_bytes == 123 * 10**9


def test_overrides_are_dataclass_replace() -> None:
    hw = get_hardware("h100")
    fast = with_overrides(hw, network_gbps=800, nvlink_domain=16)
    assert fast.net_bw == 100e9 and fast.nvlink_domain == 16
    assert fast.bf16_flops == hw.bf16_flops and "overrides" in fast.sources
    assert with_overrides(hw) is hw
    with pytest.raises(ValueError, match="cannot override"):
        with_overrides(hw, colour=1)
    with pytest.raises(ValueError, match="positive"):
        with_overrides(hw, nvlink_domain=0)
    with pytest.raises(ValueError, match="unknown gpu"):
        get_hardware("tpu-v5")
    assert all(alias_target in CATALOGUE for alias_target in ALIASES.values())


@pytest.mark.parametrize("gpu", IDS)
def test_sm_counts_are_stated_with_a_source(gpu: str) -> None:
    """The SMs communication kernels share with compute (the EP overlap): every GPU has a count and a
    source; the NVIDIA parts carry the figures their cited pages print."""
    hw = CATALOGUE[gpu]
    assert hw.sms > 0 and "sms" in hw.sources
    printed = {"a100-80gb": 108, "h100-80gb": 132, "h200-141gb": 132, "b200-180gb": 148, "gb200-186gb": 148,
               "b300-288gb": 160, "gb300-288gb": 160}
    if gpu in printed:
        assert hw.sms == printed[gpu]
