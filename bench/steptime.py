"""Validation of the step-time model against measured runs: ``python -m bench steptime``.

Predicts every calibration row (``bench/steptime_calibration.json``, a copy of
``../shared/reference/steptime/calibration.json``: 6 measured runs with their exact Megatron
settings) and every held-out row (``bench/steptime_holdout.json``: further published runs, never
used to fit a constant) from exactly the settings each row states, prints predicted vs measured
tokens/s/GPU with the error, the mean and max |error| per set, the share of concordant pairs of
runs within one model (is the predicted order of two runs the measured order?), and writes
``bench/results/steptime.json``.

``python -m bench.steptime --fit`` re-fits the fitted constants (``FIT``: a few per GPU
generation and precision) on the calibration rows only, by coordinate descent on the sum of
squared log errors, and prints them; they are then written into
``app/core/time/efficiency.py`` by hand (the constants are code, reviewed like code).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any

from app.core.engines import role_rule
from app.core.engines.megatron.placement import materialise
from app.core.layout.stages import PipelineSpec, StagePlan
from app.core.model.config import ModelConfig, load_model
from app.core.model.hardware import get_hardware
from app.core.model.roles import derive_roles
from app.core.time import StepTime, TimeSettings, step_time
from app.core.time.efficiency import CONSTANTS, Efficiency
from bench.common import save

HERE = Path(__file__).resolve().parent
CALIBRATION = HERE / "steptime_calibration.json"
HOLDOUT = HERE / "steptime_holdout.json"
CONFIGS = HERE / "steptime_configs"

#: calibration.json's names -> isplan's
_CONFIG = {"Llama-3.1-70B.json": "llama-3.1-70b", "Qwen3-235B-A22B.json": "qwen3-235b-a22b",
           "DeepSeek-V3.json": "deepseek-v3", "Qwen3-30B-A3B.json": "Qwen3-30B-A3B.json",
           "korthikanti-gpt3-175B.json": "gpt3-175b.gpt2.json"}
_SYSTEM = {"DGX-GB200": "gb200-186gb", "DGX-H100": "h100-80gb", "DGX-B200": "b200-180gb",
           "DGX-GB300": "gb300-288gb", "DGX-B300": "b300-288gb"}
_PRECISION = {"NVFP4": "nvfp4", "FP8": "fp8", "MXFP8": "mxfp8", "BF16": "bf16", "FP16 (mixed)": "bf16"}

#: The fitted constants: (generation(s), Efficiency field(s)); generations of one family share one
#: value, and ``gemm_fp8+bf16`` sets the FP8 and the BF16 ceiling to one fraction of their peaks (no
#: calibration row runs BF16 on Hopper or Blackwell).
FIT: tuple[tuple[tuple[str, ...], str], ...] = (
    (("blackwell", "blackwell_ultra"), "gemm_fp8+bf16"),
    (("blackwell", "blackwell_ultra"), "gemm_fp4"),
    (("hopper",), "gemm_fp8+bf16"),
    (("ampere",), "gemm_bf16"),
    (("ampere", "hopper", "blackwell", "blackwell_ultra", "cdna3"), "host_op"),
)


def load_rows(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text("utf-8"))
    rows = data["rows"] if isinstance(data, dict) else data
    return [normalise(r) for r in rows]


def normalise(row: dict[str, Any]) -> dict[str, Any]:
    """A calibration.json row in the held-out rows' shape (held-out rows pass through)."""
    if "gpu" in row:
        return row
    ov = row.get("overlaps") or {}
    return {
        "id": row["id"], "source": row["source"], "cite": row.get("table_cite") or row.get("source_detail"),
        "model": _CONFIG[row["config"]], "gpu": _SYSTEM.get(row["system"], "a100-80gb"),
        "precision": _PRECISION[row["precision"]], "gpus": row["gpus"], "gbs": row["gbs"], "mbs": row["mbs"],
        "seq": row["seq"], "tp": row["tp"], "pp": row["pp"], "cp": row["cp"], "vp": row["vp"], "ep": row["ep"],
        "etp": row["etp"], "dp": row["dp"], "sp": bool(row["sp"]), "mtp": row["mtp"] or 0,
        "recompute": row["recompute"],
        "overlaps": {"tp_comm_overlap": bool(ov.get("tp_comm_overlap")),
                     "overlap_grad_reduce": bool(ov.get("overlap_grad_reduce")),
                     "overlap_param_gather": bool(ov.get("overlap_param_gather")),
                     "ep_comm_overlap": bool(ov.get("moe_expert_parallel_comm_overlap"))},
        "distributed_optimizer": bool(row["distributed_optimizer"]), "layout": "auto",
        "moe_dispatcher": (row.get("dispatcher") or {}).get("type") or "flex",
        "measured": row["measured"],
    }


def model_for(name: str) -> ModelConfig:
    path = CONFIGS / name
    return load_model(str(path) if path.exists() else name)


def _recipe_layout(n: int, stages: int, mtp: int) -> str:
    """Megatron-Bridge's DeepSeek-V3 / Kimi-K2 layouts (``set_deepseek_v3_pipeline_model_parallel_layout``,
    ``_get_kimi_k2_pipeline_layout`` @ v0.6.0): ``K = (n + 3) / stages`` decoder layers per stage, the
    embedding on the first, the last stage ``K - 3`` layers with the MTP layers and the loss; spread
    evenly when that does not fit."""
    k = -(-(n + 3) // stages)
    sizes = [k] * stages
    last = n - k * (stages - 1)
    if last >= 0:
        sizes[-1] = last
    else:
        sizes = [n // stages + (1 if i < n % stages else 0) for i in range(stages)]
    parts = [("E" if i == 0 else "") + "t" * s + (("m" * mtp + "L") if i == stages - 1 else "")
             for i, s in enumerate(sizes)]
    return "|".join(parts)


def plan_for(cfg: ModelConfig, row: dict[str, Any]) -> StagePlan:
    """The row's stages: its layout string, else the recipes' rule (module docstring of each)."""
    pp, vp, mtp, n = row["pp"], row["vp"] or 1, row["mtp"] or 0, cfg.num_hidden_layers
    layout = row.get("layout") or "auto"
    vpp = vp if vp > 1 else None
    if layout != "auto":
        spec = PipelineSpec(pp=pp, layout=layout, mtp_layers=mtp)
    elif pp * vp == 1 or (n % (pp * vp) == 0 and n != 61):
        spec = PipelineSpec(pp=pp, vpp=vpp, mtp_layers=mtp)
    elif (n + 2) % (pp * vp) == 0 and n != 61:
        spec = PipelineSpec(pp=pp, vpp=vpp, account_for_embedding=True, account_for_loss=True, mtp_layers=mtp)
    else:
        spec = PipelineSpec(pp=pp, layout=_recipe_layout(n, pp * vp, mtp), mtp_layers=mtp)
    plan = materialise(spec, n)
    if plan.errors:
        raise ValueError(f"{row['id']}: {plan.errors[0].message}")
    return plan


def settings_for(row: dict[str, Any]) -> TimeSettings:
    rc = row.get("recompute") or {}
    ov = row.get("overlaps") or {}
    return TimeSettings(
        tp=row["tp"], cp=row["cp"], pp=row["pp"], vpp=row["vp"] or 1, ep=row["ep"] or 1, etp=row.get("etp"),
        dp=row["dp"], mbs=row["mbs"], global_batch=row["gbs"], seq_length=row["seq"], sp=bool(row["sp"]),
        recompute=rc.get("granularity") or "none", recompute_method=rc.get("method"),
        recompute_num_layers=rc.get("num_layers"),
        recompute_modules=tuple(rc["modules"]) if rc.get("modules") else None,
        mtp_layers=row.get("mtp") or 0, precision=row["precision"],
        tp_comm_overlap=bool(ov.get("tp_comm_overlap")), overlap_grad_reduce=bool(ov.get("overlap_grad_reduce")),
        overlap_param_gather=bool(ov.get("overlap_param_gather")), ep_comm_overlap=bool(ov.get("ep_comm_overlap")),
        distributed_optimizer=bool(row.get("distributed_optimizer", True)),
        moe_dispatcher=row.get("moe_dispatcher") or "flex",
    )


def predict(row: dict[str, Any], constants: dict[str, Efficiency] | None = None) -> StepTime:
    cfg = model_for(row["model"])
    hw = get_hardware(row["gpu"])
    eff = (constants or CONSTANTS)[hw.generation]
    return step_time(cfg, derive_roles(cfg, role_rule("megatron")), plan_for(cfg, row), settings_for(row), hw, efficiency=eff)


def evaluate(rows: list[dict[str, Any]], constants: dict[str, Efficiency] | None = None) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        measured = row["measured"]["tokens_per_s_per_gpu"]
        try:
            r = predict(row, constants)
        except ValueError as exc:
            out.append({"id": row["id"], "model": row["model"], "error": str(exc), "measured": measured})
            continue
        out.append({"id": row["id"], "model": row["model"], "gpu": row["gpu"], "precision": row["precision"],
                    "measured": measured, "predicted": r.tokens_per_second_per_gpu,
                    "err": r.tokens_per_second_per_gpu / measured - 1.0,
                    "measured_tflops": row["measured"].get("model_tflops_per_gpu"),
                    "predicted_tflops": r.model_tflops_per_gpu, "step_seconds": r.step_seconds,
                    "bubble": r.bubble_fraction,
                    "breakdown": {k: round(v["exposed"], 4) for k, v in r.breakdown.items()}})
    return out


def concordance(results: list[dict[str, Any]]) -> tuple[int, int]:
    """(concordant, total) pairs of runs of the same model whose measured values differ by > 2 %."""
    ok = total = 0
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if "predicted" in r:
            by_model.setdefault(r["model"], []).append(r)
    for runs in by_model.values():
        for a, b in combinations(runs, 2):
            if abs(a["measured"] / b["measured"] - 1) <= 0.02:
                continue
            total += 1
            ok += (a["measured"] > b["measured"]) == (a["predicted"] > b["predicted"])
    return ok, total


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["err"]) for r in results if "err" in r]
    ok, total = concordance(results)
    return {"rows": len(results), "predicted": len(errs),
            "failed": sum(1 for r in results if "error" in r),
            "mean_abs_err": sum(errs) / len(errs) if errs else None, "max_abs_err": max(errs) if errs else None,
            "within_10pct": sum(1 for e in errs if e <= 0.10), "within_25pct": sum(1 for e in errs if e <= 0.25),
            "concordant_pairs": ok, "pairs": total, "concordance": ok / total if total else None}


def _constants_with(values: dict[tuple[tuple[str, ...], str], float]) -> dict[str, Efficiency]:
    out = dict(CONSTANTS)
    for (gens, name), v in values.items():
        for g in gens:
            eff = out[g]
            if name.startswith("gemm_"):
                out[g] = replace(eff, gemm={**eff.gemm, **{d: v for d in name[5:].split("+")}})
            else:
                out[g] = replace(eff, **{name: v})
    return out


def _current(gens: tuple[str, ...], name: str) -> float:
    eff = CONSTANTS[gens[0]]
    return eff.gemm[name[5:].split("+")[0]] if name.startswith("gemm_") else float(getattr(eff, name))


def _bounded(key: tuple[tuple[str, ...], str], value: float) -> float:
    """Fractions of peak stay below 0.98; other constants are positive."""
    return min(0.98, value) if key[1].startswith("gemm_") else max(1e-9, value)


def _descend(rows: list[dict[str, Any]], values: dict[tuple[tuple[str, ...], str], float], keys: list,
             rounds: int) -> tuple[float, dict[tuple[tuple[str, ...], str], float]]:
    def loss(vals: dict[tuple[tuple[str, ...], str], float]) -> float:
        res = evaluate(rows, _constants_with(vals))
        return sum(math.log1p(r["err"]) ** 2 for r in res if "err" in r)

    best = loss(values)
    step = 0.2
    for _ in range(rounds):
        for key in keys:
            for factor in (1 + step, 1 / (1 + step)):
                while True:
                    trial = dict(values)
                    trial[key] = _bounded(key, values[key] * factor)
                    val = loss(trial)
                    if val >= best:
                        break
                    best, values = val, trial
        step /= 2
    return best, values


#: Starting points of the host cost per operation (seconds): the loss has a plateau at small values
#: (no run host-bound) that coordinate descent cannot leave, so each start is descended from.
HOST_STARTS = (0.0, 20e-6, 40e-6, 60e-6, 80e-6)


def fit(rows: list[dict[str, Any]], rounds: int = 5) -> dict[tuple[tuple[str, ...], str], float]:
    """Least squares in log tokens/s over :data:`FIT` on the calibration rows only: for each start
    of the host cost (:data:`HOST_STARTS`) the GEMM ceilings are fitted by coordinate descent, then
    all constants together from the best start."""
    host_key = next(k for k in FIT if k[1] == "host_op")
    gemm_keys = [k for k in FIT if k != host_key]
    results = []
    for h in HOST_STARTS:
        values = {key: _current(*key) for key in FIT}
        values[host_key] = h
        results.append(_descend(rows, values, gemm_keys, rounds))
    _, values = min(results, key=lambda x: x[0])
    if values[host_key] == 0.0:
        values[host_key] = 1e-6
    return _descend(rows, values, list(FIT), rounds)[1]


def _print(title: str, results: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'run':78s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for r in results:
        if "error" in r:
            print(f"{r['id'][:78]:78s} {r['measured']:9.0f} {'-':>9s}  {r['error'][:60]}")
        else:
            print(f"{r['id'][:78]:78s} {r['measured']:9.0f} {r['predicted']:9.0f} {r['err']:+7.1%}")
    s = summary(results)
    if s["mean_abs_err"] is not None:
        conc = f"{s['concordance']:.0%}" if s["concordance"] is not None else "n/a"
        print(f"mean |error| {s['mean_abs_err']:.1%}, max {s['max_abs_err']:.1%}, within 10 %: {s['within_10pct']}/"
              f"{s['predicted']}, within 25 %: {s['within_25pct']}/{s['predicted']}, same order within a model: "
              f"{s['concordant_pairs']}/{s['pairs']} ({conc}); not predicted: {s['failed']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    calibration = load_rows(CALIBRATION)
    if "--fit" in argv:
        values = fit(calibration)
        for (gens, name), v in values.items():
            print(f"{'/'.join(gens):28s} {name:12s} {v:.4f}")
        return {"fitted": {f"{'/'.join(g)}.{n}": v for (g, n), v in values.items()}}
    holdout = load_rows(HOLDOUT)
    t0 = time.perf_counter()
    cal = evaluate(calibration)
    held = evaluate(holdout)
    elapsed = time.perf_counter() - t0
    _print("calibration rows (the fitted constants were fitted on these)", cal)
    _print("held-out rows (never used for fitting)", held)
    result = {"calibration": {"summary": summary(cal), "rows": cal},
              "holdout": {"summary": summary(held), "rows": held},
              "seconds": elapsed, "errors": sum(1 for r in cal if "error" in r)}
    path = save("steptime", result)
    print(f"\n{len(cal) + len(held)} runs predicted in {elapsed:.1f} s; wrote {path}")
    return result


if __name__ == "__main__":
    main()
