"""The whole plan as URL query parameters, parsed field by field.

Parameter names mirror the CLI flags (``model``, ``split``, ``pp``, ``first``, ``last``, ``vpp``,
``layout``, ``tp``, ``cp``, ``ep``, ``etp``, ``dp``, ``gpus``, ``mbs``, ...). A bad value never
fails the page: the field falls back to its default and gets a message naming the field, the value
and the fix. An empty query string is the pinned GLM-5.2 slime PP8 training profile (TP4 CP8 PP8
EP32 ETP1 SP, first 14 last 16, full recompute, 8192 tokens per GPU, optimizer CPU offload);
otherwise an absent parameter takes its neutral default, so a share URL always means the same plan.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping
from urllib.parse import urlencode

from app.core.layer_roles import ENGINES

MODES = ("flags", "split", "layout")
RECOMPUTE = ("none", "selective", "full")
GPUS = ("h100-80gb", "h200-141gb", "b200-180gb", "mi300x-192gb", "custom")
CONV_MODES = ("none", "flags", "split")


@dataclass
class PlanState:
    model: str = "glm-5.2"
    engine: str = "megatron"
    pattern: str | None = None
    mode: str = "flags"
    split: str | None = None
    pp: int = 1
    first: int | None = None
    last: int | None = None
    vpp: int = 1
    layout: str | None = None
    mtp: int | None = None
    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int | None = None
    gpus: int | None = None
    sp: bool = False
    mbs: int = 1
    mb: int | None = None
    seq: int | None = None
    tpg: int | None = None
    gpu: str = "h100-80gb"
    gpu_gb: float | None = None
    recompute: str = "none"
    rnl: int = 1
    offload: bool = False
    conv: str = "none"
    conv_split: str | None = None
    conv_pp: int | None = None
    conv_first: int | None = None
    conv_last: int | None = None
    ctx: int = 1_048_576
    errors: dict[str, str] = field(default_factory=dict)

    def query(self, **overrides: Any) -> str:
        """The canonical query string of this state (defaults and empty values left out)."""
        neutral = PlanState()
        data = {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "errors"}, **overrides}
        out = []
        for key, value in data.items():
            if value is None or value == "" or (value == getattr(neutral, key, object()) and key != "model"):
                continue
            if isinstance(value, bool):
                value = "1"
            out.append((key, value))
        return urlencode(out)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("errors")
        return d


DEFAULT_PROFILE = dict(
    model="glm-5.2", mode="flags", pp=8, first=14, last=16, tp=4, cp=8, ep=32, etp=1, dp=1, sp=True,
    mbs=1, tpg=8192, recompute="full", rnl=1, offload=True, conv="flags", conv_pp=2, conv_last=40,
)


def _int(raw: str, name: str, lo: int, hi: int) -> int:
    text = raw.strip()
    if not re.fullmatch(r"-?[0-9]+", text) or len(text) > 12:  # ASCII digits only
        raise ValueError(f"{name} must be a whole number, got {raw[:40]!r}")
    v = int(text)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {v}")
    return v


_INT_LIMITS: dict[str, tuple[int, int]] = {
    "pp": (1, 256), "first": (1, 4096), "last": (1, 4096), "vpp": (1, 16), "mtp": (0, 16), "tp": (1, 64),
    "cp": (1, 256), "ep": (1, 4096), "etp": (1, 64), "dp": (1, 1 << 20), "gpus": (1, 1 << 20), "mbs": (1, 1024),
    "mb": (1, 1 << 16), "seq": (1, 1 << 24), "tpg": (1, 1 << 24), "rnl": (1, 4096), "conv_pp": (1, 256),
    "conv_first": (1, 4096), "conv_last": (1, 4096), "ctx": (1024, 1 << 24),
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "engine": ENGINES, "mode": MODES, "recompute": RECOMPUTE, "gpu": GPUS, "conv": CONV_MODES,
}
_TEXT_LIMITS = {"model": 80, "pattern": 4096, "split": 20_000, "layout": 20_000, "conv_split": 20_000}
_BOOLS = ("sp", "offload")
_HINTS = {
    "pp": "the pipeline-parallel size", "tp": "the tensor-parallel size", "ep": "the expert-parallel size",
    "first": "layers on the first pipeline stage", "last": "layers on the last pipeline stage",
}


def parse_state(params: Mapping[str, str]) -> PlanState:
    """Parse query parameters into a :class:`PlanState`; bad fields keep their default and get an
    entry in ``state.errors``."""
    known = {f.name for f in fields(PlanState)} - {"errors"}
    given = {k: v for k, v in params.items() if k in known}
    if not given:
        return PlanState(**DEFAULT_PROFILE)
    state = PlanState()
    for key, raw in given.items():
        raw = str(raw)
        try:
            if raw.strip() == "":
                continue
            if key in _INT_LIMITS:
                lo, hi = _INT_LIMITS[key]
                setattr(state, key, _int(raw, key, lo, hi))
            elif key in _CHOICES:
                if raw not in _CHOICES[key]:
                    raise ValueError(f"{key} must be one of {', '.join(_CHOICES[key])}, got {raw[:40]!r}")
                setattr(state, key, raw)
            elif key in _BOOLS:
                if raw not in ("0", "1", "true", "false", "on", "off"):
                    raise ValueError(f"{key} must be 1 or 0, got {raw[:40]!r}")
                setattr(state, key, raw in ("1", "true", "on"))
            elif key == "gpu_gb":
                try:
                    v = float(raw)
                except ValueError:
                    raise ValueError(f"gpu_gb must be a number of GB, got {raw[:40]!r}") from None
                if not 1 <= v <= 10_000:
                    raise ValueError(f"gpu_gb must be between 1 and 10000 GB, got {raw[:40]}")
                state.gpu_gb = v
            else:
                limit = _TEXT_LIMITS.get(key, 1000)
                if len(raw) > limit:
                    raise ValueError(f"{key} is {len(raw):,} characters; the limit is {limit:,}")
                setattr(state, key, raw)
        except ValueError as exc:
            hint = _HINTS.get(key)
            state.errors[key] = str(exc) + (f" ({hint})" if hint else "")
    if "mode" not in given:  # a hand-written URL: the layout is whatever was given
        state.mode = "layout" if state.layout else "split" if state.split else "flags"
    if state.mode == "split" and not state.split:
        state.errors.setdefault("split", "mode=split needs split=LIST of stage sizes, e.g. 14,8,8,8,8,8,8,16")
    if state.mode == "layout" and not state.layout:
        state.errors.setdefault("layout", "mode=layout needs layout=STR, e.g. Et*3|(tt|)*29,m|L")
    return state


def error_fields() -> list[str]:
    return [f.name for f in fields(PlanState) if f.name != "errors"]
