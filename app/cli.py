"""``isplan``: the command-line shell over :mod:`app.core`.

Exit codes (every subcommand): 0 valid / done, 1 invalid layout or a receipt that does not verify,
2 bad input or usage. ``check`` imports only the core (no web stack, no pydantic, no plotting), so it
can run inside a launch script as a gate.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn, Sequence

from app import __version__
from app.core.layer_roles import ENGINES, PatternError, roles_report
from app.core.model_config import ConfigError, ModelConfig, load_model, preset_ids
from app.core.stages import LayoutInputError, PipelineSpec, parse_split

EXIT_VALID, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input detected after argparse (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own usage errors: exit 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", metavar="MODEL",
        help=f"a preset id ({', '.join(preset_ids())}) or a path to an HF config.json",
    )
    p.add_argument("--engine", choices=ENGINES, default="megatron",
                   help="whose rule derives full/shared roles from freq/offset (default: megatron)")
    p.add_argument("--pattern", metavar="P",
                   help="what-if role override: F/S letters, periodic from layer 1 (FSSS) or one per layer")


def add_layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "layout (one of: --split, --pp with flags, --pp with --layout, --launcher)")
    g.add_argument("--split", metavar="LIST", help="stage sizes, vp-major, e.g. 14,8,8,8,8,8,8,16")
    g.add_argument("--pp", type=int, metavar="N", help="--pipeline-model-parallel-size")
    g.add_argument("--first", type=int, metavar="F", help="--decoder-first-pipeline-num-layers")
    g.add_argument("--last", type=int, metavar="L", help="--decoder-last-pipeline-num-layers")
    g.add_argument("--vpp", type=int, metavar="V", help="--num-virtual-stages-per-pipeline-rank")
    g.add_argument("--layers-per-vstage", type=int, metavar="K",
                   help="--num-layers-per-virtual-pipeline-stage")
    g.add_argument("--account-for-embedding", action="store_true",
                   help="--account-for-embedding-in-pipeline-split")
    g.add_argument("--account-for-loss", action="store_true", help="--account-for-loss-in-pipeline-split")
    g.add_argument("--layout", metavar="STR", help="--pipeline-model-parallel-layout, e.g. 'Et*3|(tt|)*29,m|L'")
    g.add_argument("--launcher", metavar="FILE", help="a bash launcher script to read the flags from (- for stdin)")
    g.add_argument("--mtp-layers", type=int, metavar="M",
                   help="--mtp-num-layers (default: the config's num_nextn_predict_layers)")
    g.add_argument("--overlap-p2p", action="store_true",
                   help="--overlap-p2p-communication (interleaving then needs PP > 1 instead of > 2)")
    g.add_argument("--dsa-topk-freq", type=int, metavar="N",
                   help="--dsa-indexer-topk-freq override for the megatron/slime rule")
    g.add_argument("--dsa-skip-topk-offset", type=int, metavar="N",
                   help="--dsa-indexer-skip-topk-offset override for the megatron/slime rule")


def _out(fmt: str, body: dict[str, Any], lines: list[str]) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        # a string from a hostile input may hold lone surrogates: print them escaped, never crash
        sys.stdout.write(("\n".join(lines) + "\n").encode("utf-8", "backslashreplace").decode("utf-8"))


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, "rb") as fh:
            data = fh.read((1 << 20) + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    return data.decode("utf-8", errors="replace")


class LayoutRequest:
    """A resolved layout description: the spec plus what a launcher contributed."""

    def __init__(self, spec: PipelineSpec, freq: int | None, offset: int | None,
                 warnings: tuple[str, ...] = (), extra: dict[str, Any] | None = None,
                 errors: tuple[Any, ...] = ()):
        self.spec, self.freq, self.offset = spec, freq, offset
        self.warnings = warnings
        self.extra = extra or {}
        self.errors = errors


def layout_request(args: argparse.Namespace, cfg: ModelConfig) -> LayoutRequest:
    """Turn the layout options into a :class:`PipelineSpec` (exit-2 errors for unusable input)."""
    chosen = [name for name, on in (
        ("--split", args.split is not None), ("--launcher", args.launcher is not None),
        ("--layout", args.layout is not None),
        ("--pp", args.pp is not None and args.layout is None and args.split is None),
    ) if on]
    flag_only = [n for n, v in (("--first", args.first), ("--last", args.last),
                                ("--layers-per-vstage", args.layers_per_vstage)) if v is not None]
    if args.account_for_embedding:
        flag_only.append("--account-for-embedding")
    if args.account_for_loss:
        flag_only.append("--account-for-loss")
    if args.launcher is not None:
        others = [c for c in chosen if c != "--launcher"] + flag_only
        if others:
            raise UsageError(f"--launcher reads every pipeline flag from the script; drop {', '.join(others)}")
        from app.core.launcher import LauncherError, launcher_request, parse_launcher

        try:
            parsed = parse_launcher(_read_text(args.launcher))
        except LauncherError as exc:
            raise UsageError(str(exc)) from None
        req = launcher_request(parsed, cfg)
        if req.unresolved:
            raise UsageError("; ".join(req.unresolved))
        return LayoutRequest(req.spec, req.freq, req.offset, tuple(req.warnings), {"launcher": req.report},
                             errors=req.errors)
    if args.split is not None:
        if flag_only or args.layout is not None:
            raise UsageError("--split gives every stage size; drop " + ", ".join(flag_only + (["--layout"] if args.layout else [])))
        spec = PipelineSpec(pp=args.pp, vpp=args.vpp, split=parse_split(args.split),
                            mtp_layers=args.mtp_layers, overlap_p2p=args.overlap_p2p)
    elif args.pp is not None or args.layout is not None:
        spec = PipelineSpec(
            pp=args.pp, vpp=args.vpp, layers_per_vstage=args.layers_per_vstage, first=args.first,
            last=args.last, account_for_embedding=args.account_for_embedding,
            account_for_loss=args.account_for_loss, layout=args.layout, mtp_layers=args.mtp_layers,
            overlap_p2p=args.overlap_p2p,
        )
        if args.layout is not None and args.pp is None:
            raise UsageError("--layout needs --pp N: the stage list is read as PP x VPP stages")
    else:
        raise UsageError("give a layout: --split LIST, --pp N [flags], --pp N --layout STR, or --launcher FILE")
    return LayoutRequest(spec, args.dsa_topk_freq, args.dsa_skip_topk_offset)


def _engine_overrides(engine: str, req: LayoutRequest) -> tuple[int | None, int | None, tuple[str, ...]]:
    if engine == "hf" and (req.freq is not None or req.offset is not None):
        return None, None, ("--dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset are Megatron flags; "
                            "the hf engine reads the config, so they are ignored",)
    return req.freq, req.offset, ()


def cmd_check(args: argparse.Namespace) -> int:
    from app.core.layout_check import run_check

    cfg = load_model(args.model)
    req = layout_request(args, cfg)
    freq, offset, notes = _engine_overrides(args.engine, req)
    result = run_check(cfg, req.spec, args.engine, pattern=args.pattern, freq=freq, offset=offset,
                       extra_errors=req.errors, extra_warnings=req.warnings + notes, extra=req.extra)
    _out(args.format, result.to_json(), result.text_lines())
    return EXIT_VALID if result.valid else EXIT_INVALID


def cmd_roles(args: argparse.Namespace) -> int:
    cfg = load_model(args.model)
    rep = roles_report(cfg, args.engine, pattern=args.pattern, freq=args.dsa_topk_freq,
                       offset=args.dsa_skip_topk_offset)
    lines = [f"model {cfg.id}: {rep['num_layers']} layers, {rep['num_full']} full, {rep['num_shared']} shared "
             f"(rule: {rep['rule']}, engine {rep['engine']})", rep["pattern"]]
    lines.append("full layers: " + ", ".join(str(x) for x in rep["full_layers"]))
    for d in rep["disagreements"]:
        lines.append("disagreement: " + d["message"])
    if rep["pattern_differences"] is not None:
        lines.append("pattern differs from the config on layers: "
                     + (", ".join(map(str, rep["pattern_differences"])) or "none"))
    for e in rep["errors"]:
        lines.append("ERROR: " + e["message"])
    _out(args.format, rep, lines)
    return EXIT_INVALID if rep["errors"] else EXIT_VALID


def _named_layouts(args: argparse.Namespace, cfg: ModelConfig) -> list[tuple[str, LayoutRequest]]:
    import shlex

    layouts = [(args.name, layout_request(args, cfg))]
    for item in args.also or []:
        name, sep, rest = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--also takes NAME=ARGS, e.g. 'conversion=--pp 2 --last 40'; got {item!r}")
        sub = _Parser(prog=f"isplan receipt --also {name}", add_help=False)
        add_layout_args(sub)
        try:
            sub_args = sub.parse_args(shlex.split(rest))
        except SystemExit:
            raise UsageError(f"--also {name}: cannot parse {rest!r}") from None
        layouts.append((name.strip(), layout_request(sub_args, cfg)))
    names = [n for n, _ in layouts]
    if len(set(names)) != len(names):
        raise UsageError(f"layout names must differ; got {names}")
    return layouts


def cmd_receipt(args: argparse.Namespace) -> int:
    from app.core.receipt import build_receipt

    cfg = load_model(args.model)
    layouts = _named_layouts(args, cfg)
    receipt = build_receipt(
        cfg, [(name, req.spec, req.freq, req.offset, req.warnings) for name, req in layouts],
        engine=args.engine, pattern=args.pattern, model_revision=args.model_revision,
        engine_commit=args.engine_commit,
    )
    sys.stdout.write(json.dumps(receipt, indent=2) + "\n")
    for w in receipt["warnings"]:
        sys.stderr.write(f"warning: {w}\n")
    return EXIT_VALID if receipt["valid"] else EXIT_INVALID


def cmd_verify(args: argparse.Namespace) -> int:
    from app.core.receipt import ReceiptError, verify_receipt

    text = _read_text(args.receipt)
    try:
        receipt = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{args.receipt} is not JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        report = verify_receipt(receipt, config_path=args.config)
    except ReceiptError as exc:
        raise UsageError(str(exc)) from None
    lines = [("VERIFIED: " if report["ok"] else "DIFFERS: ") + report["summary"]]
    lines += [f"- {d}" for d in report["differences"]]
    _out(args.format, report, lines)
    return EXIT_VALID if report["ok"] else EXIT_INVALID


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallelism (Megatron flag names in brackets; a --launcher supplies defaults)")
    g.add_argument("--tp", type=int, help="[--tensor-model-parallel-size]")
    g.add_argument("--cp", type=int, help="[--context-parallel-size]")
    g.add_argument("--ep", type=int, help="[--expert-model-parallel-size]")
    g.add_argument("--etp", type=int, help="[--expert-tensor-parallel-size] (default: TP)")
    g.add_argument("--dp", type=int, help="data-parallel size (or give --gpus)")
    g.add_argument("--gpus", type=int, help="total GPUs; DP = GPUs / (TP x CP x PP)")
    g.add_argument("--sp", action="store_true", default=None, help="[--sequence-parallel]")
    g.add_argument("--mbs", type=int, help="[--micro-batch-size] (default 1)")
    g.add_argument("--num-microbatches", type=int, help="micro-batches per step per DP rank")
    g.add_argument("--global-batch", type=int, help="[--global-batch-size]; micro-batches follow")
    g.add_argument("--seq-length", type=int, help="[--seq-length] tokens per sample")
    g.add_argument("--tokens-per-gpu", type=int, help="[--max-tokens-per-gpu] tokens per GPU after the CP split")
    g.add_argument("--recompute", choices=("none", "selective", "full"), help="[--recompute-granularity]")
    g.add_argument("--recompute-method", choices=("uniform", "block"), help="[--recompute-method]")
    g.add_argument("--recompute-num-layers", type=int, help="[--recompute-num-layers]")
    g.add_argument("--optimizer-cpu-offload", action="store_true", default=None, help="[--optimizer-cpu-offload]")
    g.add_argument("--use-precision-aware-optimizer", action="store_true", default=None,
                   help="[--use-precision-aware-optimizer] (bytes change only with lower dtypes)")
    g.add_argument("--no-distributed-optimizer", action="store_true", help="plain Adam states on every DP rank")
    g.add_argument("--gpu", default=None, help="GPU preset: h100-80gb (default), h200-141gb, b200-180gb, mi300x-192gb, custom")
    g.add_argument("--gpu-memory-gb", type=float, help="capacity for --gpu custom, in GB (1e9 bytes)")


_LAUNCHER_PARALLEL = {
    "tp": "--tensor-model-parallel-size", "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size", "etp": "--expert-tensor-parallel-size",
    "mbs": "--micro-batch-size", "global_batch": "--global-batch-size", "seq_length": "--seq-length",
    "tokens_per_gpu": "--max-tokens-per-gpu", "recompute_num_layers": "--recompute-num-layers",
}


def parallel_config(args: argparse.Namespace, req: LayoutRequest | None, pp: int, vpp: int):
    """A :class:`ParallelConfig` from the flags, with a launcher's values as defaults."""
    from app.core.parallelism import ParallelConfig

    launcher = (req.extra.get("launcher") if req else None) or {}
    values, switches = launcher.get("values", {}), set(launcher.get("switches", []))
    kw: dict[str, Any] = {}
    for key, flag in _LAUNCHER_PARALLEL.items():
        cli = getattr(args, key, None)
        if cli is not None:
            kw[key] = cli
        elif flag in values:
            try:
                kw[key] = int(values[flag])
            except ValueError:
                raise UsageError(f"{flag} in the launcher is {values[flag]!r}, not a whole number") from None
    for key, flag in (("recompute", "--recompute-granularity"), ("recompute_method", "--recompute-method")):
        cli = getattr(args, key, None)
        if cli is not None:
            kw[key] = cli
        elif flag in values:
            kw[key] = values[flag]
    for key, flag in (("sp", "--sequence-parallel"), ("optimizer_cpu_offload", "--optimizer-cpu-offload"),
                      ("use_precision_aware_optimizer", "--use-precision-aware-optimizer")):
        kw[key] = bool(getattr(args, key, None)) or flag in switches
    if args.dp is not None:
        kw["dp"] = args.dp
    if args.gpus is not None:
        kw["gpus"] = args.gpus
    elif args.dp is None:
        nodes = values.get("--actor-num-nodes") or values.get("--nnodes")
        per = values.get("--actor-num-gpus-per-node") or values.get("--nproc-per-node") or values.get("--num-gpus-per-node")
        if nodes and per and nodes.isascii() and per.isascii() and nodes.isdigit() and per.isdigit():
            kw["gpus"] = int(nodes) * int(per)
    if args.no_distributed_optimizer:
        kw["distributed_optimizer"] = False
    if args.gpu is not None:
        kw["gpu"] = args.gpu
    if args.gpu_memory_gb is not None:
        kw["gpu_capacity_bytes"] = int(args.gpu_memory_gb * 1e9)
        kw.setdefault("gpu", "custom")
    kw.setdefault("seq_length", None)
    if kw.get("seq_length") is None and kw.get("tokens_per_gpu") is None:
        kw["seq_length"] = 4096
    try:
        return ParallelConfig(pp=pp, vpp=vpp if vpp > 1 else None, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_params(args: argparse.Namespace) -> int:
    from app.core.layer_roles import derive_roles
    from app.core.parameters import count_parameters, per_rank_params
    from app.core.stages import materialise

    cfg = load_model(args.model)
    roles = derive_roles(cfg, args.engine, pattern=args.pattern)
    body: dict[str, Any] = {"model": cfg.summary(), **count_parameters(cfg, roles).to_json()}
    if not args.per_layer:
        body.pop("per_layer")
    if _has_layout(args):
        req = layout_request(args, cfg)
        plan = materialise(req.spec, cfg.num_hidden_layers, default_mtp=cfg.num_nextn_predict_layers)
        if plan.errors:
            raise UsageError("; ".join(e.message for e in plan.errors))
        tp, ep = args.tp or 1, args.ep or 1
        ranks = per_rank_params(cfg, roles, plan, tp=tp, ep=ep, etp=args.etp)
        body["stages"] = [{"pp_rank": r, "total": sp.total, "dense_total": sp.dense_total,
                           "expert_total": sp.expert_total, "per_gpu": sp.per_gpu,
                           "dense_per_gpu": sp.dense_per_gpu, "expert_per_gpu": sp.expert_per_gpu,
                           "components": sp.components} for r, sp in enumerate(ranks)]
        body["sharding"] = {"tp": tp, "ep": ep, "etp": args.etp if args.etp is not None else tp}
    lines = [f"model {cfg.id}", f"main_total       {body['main_total']:>20,}  (no MTP, no router bias)",
             f"checkpoint_total {body['checkpoint_total']:>20,}  (+ MTP layers and router biases)",
             f"active           {body['active']:>20,}  per token", f"indexer_layers   {body['indexer_layers']:>20}"]
    lines += [f"  {k:<16}{v:>20,}" for k, v in body["breakdown"].items()]
    for st in body.get("stages", []):
        lines.append(f"pp rank {st['pp_rank']}: {st['total']:,} params, {st['per_gpu']:,} per GPU")
    _out(args.format, body, lines)
    return EXIT_VALID


def _has_layout(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("split", "pp", "layout", "launcher"))


def cmd_memory(args: argparse.Namespace) -> int:
    from app.core.layer_roles import derive_roles
    from app.core.memory import inference_memory, training_memory
    from app.core.stages import materialise

    cfg = load_model(args.model)
    if args.inference:
        try:
            body = inference_memory(cfg, tp=args.tp or 1, ep=args.ep or 1, dp_attention=args.dp_attention,
                                    kv_dtype=args.kv_dtype, context=args.context, batch=args.batch,
                                    gpu=args.gpu or "h100-80gb",
                                    gpu_capacity_bytes=int(args.gpu_memory_gb * 1e9) if args.gpu_memory_gb else None,
                                    weight_dtype=args.weight_dtype, include_mtp=args.include_mtp)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        _out(args.format, body, [json.dumps(body, indent=2)])
        return EXIT_VALID
    req = layout_request(args, cfg)
    plan = materialise(req.spec, cfg.num_hidden_layers, default_mtp=cfg.num_nextn_predict_layers)
    if plan.errors:
        raise UsageError("the layout is not one Megatron accepts: " + "; ".join(e.message for e in plan.errors))
    par = parallel_config(args, req, plan.pp, plan.vpp)
    roles = derive_roles(cfg, args.engine, pattern=args.pattern)
    body = training_memory(cfg, plan, par, roles)
    lines = [f"{body['gpus']} GPUs ({body['gpu']['label']}), expert grid {body['expert_grid']}"]
    for st in body["stages"]:
        lines.append(f"pp rank {st['pp_rank']}: {st['total_bytes'] / 1e9:7.1f} GB of {st['capacity_bytes'] / 1e9:.0f} GB "
                     + ("fits" if st["fits"] else "OVERFLOWS") + f"  (largest term: {st['dominant_label']})")
    mt = body["megatron_theoretical"]
    lines.append(f"Megatron report_theoretical_memory (even split, no indexer/uneven terms): most-loaded shard "
                 f"{mt['params_most_loaded_shard'] / 1e9:.2f}B params, {mt['weight_and_optimizer_gib']:.1f} GiB "
                 "weights + optimizer state")
    lines.append(body["explanation"])
    _out(args.format, body, lines)
    return EXIT_VALID if body["fits"] else EXIT_INVALID


def cmd_flops(args: argparse.Namespace) -> int:
    from app.core.flops import flops_report

    cfg = load_model(args.model)
    if args.context < 1:
        raise UsageError(f"--context must be at least 1, got {args.context}")
    body = flops_report(cfg, args.context, pattern=args.pattern)
    if args.global_batch is not None:
        from app.core.flops import training_flops
        from app.core.layer_roles import derive_roles

        try:
            body["training"] = training_flops(cfg, derive_roles(cfg, args.engine, pattern=args.pattern),
                                              seq_length=args.seq_length, global_batch_size=args.global_batch,
                                              recompute=args.recompute)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    n_idx = body.get("indexer_layers", {})
    lines = [f"per-token forward FLOPs of {cfg.id} at context {args.context:,}",
             f"IndexShare ({n_idx.get('indexshare', '?')} indexer layers): {body['indexshare_flops']:>22,}",
             f"indexer on every layer ({n_idx.get('every_layer', '?')}): {body['every_layer_flops']:>22,}",
             f"ratio {body['ratio']:.3f} ({body['default_convention']}, the published 2.9x's convention)"]
    lines += [f"  ratio {v:.3f} counting {k}" for k, v in body["ratios"].items()]
    if "training" in body:
        t = body["training"]
        lines.append(f"training step ({args.global_batch} x {args.seq_length} tokens, recompute {args.recompute}): "
                     f"{t.get('step_flops', t.get('total', 0)):,} FLOPs")
    lines += ["", body["convention"]]
    _out(args.format, body, lines)
    return EXIT_VALID


def cmd_plan(args: argparse.Namespace) -> int:
    from app.core.layer_roles import derive_roles
    from app.core.plan_search import plan_report

    cfg = load_model(args.model)
    roles = derive_roles(cfg, args.engine, pattern=args.pattern)
    near = parse_split(args.near) if args.near is not None else None
    try:
        body = plan_report(cfg, roles, pp=args.pp, vpp=args.vpp, objective=args.objective,
                           context=args.context, top=args.top, near=near)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    lc_unit, objective = body["cost_unit"], body["objective"]
    lines = [f"{cfg.id}: {body['valid_layout_count']:,} valid layouts for PP {args.pp} x VPP {args.vpp} "
             f"(objective {objective}: {lc_unit})"]
    if body["best"] is None:
        lines.append("no valid layout: fewer full layers than stages (or layer 1 is shared)")
    else:
        b = body["best"]
        lines.append(f"best: --split {','.join(map(str, b['split']))}  (starts {b['starts']}; max {b['max_cost']:.6g})")
        lines.append("      " + " ".join(b["megatron_flags"]))
        for k, alt in enumerate(body["alternatives"], start=2):
            lines.append(f"#{k}:   --split {','.join(map(str, alt['split']))}  (max {alt['max_cost']:.6g})")
    if "near" in body and body["near"]:
        n = body["near"]
        lines.append(f"nearest valid to {','.join(map(str, n['from']))}: {','.join(map(str, n['split']))} "
                     f"({n['moved']} layer(s) move)")
    _out(args.format, body, lines)
    return EXIT_VALID if body["best"] is not None else EXIT_INVALID


def cmd_search(args: argparse.Namespace) -> int:
    from app.core.search import search

    cfg = load_model(args.model)
    try:
        body = search(cfg, args.gpus, gpu=args.gpu, gpu_capacity_bytes=int(args.gpu_memory_gb * 1e9)
                      if args.gpu_memory_gb else None, seq_length=args.seq_length,
                      tokens_per_gpu=args.tokens_per_gpu, mbs=args.mbs,
                      num_microbatches=args.num_microbatches, top=args.top, engine=args.engine)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    c = body["counts"]
    lines = [f"{cfg.id} on {args.gpus} x {body['gpu']['label']}: {c['combinations']:,} combinations in "
             f"{body['seconds']:.2f} s; dropped {c['constraint']:,} (constraints), {c['no_layout']:,} (no valid "
             f"layout), {c['memory']:,} (memory); {c['feasible']:,} feasible (+{c['dominated']:,} dominated)",
             "ranking: " + body["ranking_model"]]
    for k, r in enumerate(body["results"], start=1):
        lines.append(f"#{k} TP{r['tp']} CP{r['cp']} PP{r['pp']} DP{r['dp']} EP{r['ep']} ETP{r['etp']} VPP{r['vpp']} "
                     f"recompute={r['recompute']} offload={'on' if r['optimizer_cpu_offload'] else 'off'}: "
                     f"{r['max_rank_bytes'] / 1e9:.1f} GB peak, time x{r['relative_step_time']:.3f}, "
                     f"split {','.join(map(str, r['split']))}")
    _out(args.format, body, lines)
    return EXIT_VALID if body["results"] else EXIT_INVALID


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="isplan",
        description="IndexShare layout planner: validate that every physical and virtual pipeline "
                    "stage of a GLM-5.2-class model starts on a full (index-computing) layer.",
        epilog="Exit codes: 0 valid, 1 invalid layout (or receipt differs), 2 bad input or usage.",
    )
    parser.add_argument("--version", action="version", version=f"isplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("check", help="materialise a layout and validate every stage start",
                       description="Materialise the stages Megatron/slime would build and check each start.")
    _add_model(p)
    add_layout_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("roles", help="per-layer full/shared roles, sources and disagreements")
    _add_model(p)
    p.add_argument("--dsa-topk-freq", type=int, metavar="N", help="--dsa-indexer-topk-freq override")
    p.add_argument("--dsa-skip-topk-offset", type=int, metavar="N", help="--dsa-indexer-skip-topk-offset override")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_roles)

    p = sub.add_parser("receipt", help="write a verifiable JSON receipt for one or more named layouts")
    _add_model(p)
    add_layout_args(p)
    p.add_argument("--name", default="training", help="name of the layout given by the flags (default: training)")
    p.add_argument("--also", action="append", metavar="NAME=ARGS",
                   help="another named layout, e.g. --also 'conversion=--pp 2 --last 40' (repeatable)")
    p.add_argument("--model-revision", metavar="REV", help="immutable model revision (40-hex commit)")
    p.add_argument("--engine-commit", metavar="SHA", help="Megatron/slime commit the job runs (40-hex)")
    p.set_defaults(func=cmd_receipt)

    p = sub.add_parser("verify", help="recompute a receipt and report every difference")
    p.add_argument("receipt", metavar="RECEIPT", help="receipt JSON file (- for stdin)")
    p.add_argument("--config", metavar="PATH", help="config.json to verify against (default: the receipt's preset or path)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("params", help="parameter counts: totals, active, per component, per stage and GPU")
    _add_model(p)
    add_layout_args(p)
    g = p.add_argument_group("sharding for per-GPU counts")
    g.add_argument("--tp", type=int)
    g.add_argument("--ep", type=int)
    g.add_argument("--etp", type=int)
    p.add_argument("--per-layer", action="store_true", help="include one entry per decoder layer")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("memory", help="training memory per GPU per pipeline rank (or --inference)",
                       description="Training memory per GPU of every pipeline rank, beside Megatron's own "
                                   "estimate; exit 1 when a rank overflows the GPU. --inference: serving memory.")
    _add_model(p)
    add_layout_args(p)
    add_parallel_args(p)
    g = p.add_argument_group("inference (--inference)")
    g.add_argument("--inference", action="store_true", help="serving memory: weights + KV cache")
    g.add_argument("--context", type=int, help="tokens per sequence")
    g.add_argument("--batch", type=int, default=1, help="sequences")
    g.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    g.add_argument("--weight-dtype", choices=("bf16", "fp8"), default="bf16")
    g.add_argument("--dp-attention", action="store_true")
    g.add_argument("--include-mtp", action="store_true", help="serve the MTP layer (its KV and weights)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("flops", help="per-token forward FLOPs with and without IndexShare")
    _add_model(p)
    p.add_argument("--context", type=int, default=1_048_576, help="context length L (default 1,048,576)")
    p.add_argument("--global-batch", type=int, help="also training FLOPs per step for this many sequences")
    p.add_argument("--seq-length", type=int, default=4096, help="tokens per sequence for --global-batch (default 4096)")
    p.add_argument("--recompute", choices=("none", "full"), default="none", help="full: one more forward per step")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_flops)

    p = sub.add_parser("plan", help="the exact min-max optimal valid layout, alternatives, nearest valid")
    _add_model(p)
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    p.add_argument("--vpp", type=int, default=1, help="virtual stages per rank (default 1)")
    p.add_argument("--objective", choices=("compute", "memory", "balanced"), default="balanced")
    p.add_argument("--context", type=int, default=4096, help="context for the compute objective (default 4096)")
    p.add_argument("--top", type=int, default=3, help="alternatives after the best (default 3)")
    p.add_argument("--near", metavar="LIST", help="also give the valid layout closest to this split")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("search", help="rank parallel configurations for a GPU budget")
    p.add_argument("model", metavar="MODEL", nargs="?", default="glm-5.2", help="preset id or config.json (default glm-5.2)")
    p.add_argument("--engine", choices=ENGINES, default="megatron")
    p.add_argument("--gpus", type=int, required=True, help="GPU budget")
    p.add_argument("--gpu", default="h100-80gb", help="GPU preset (h100-80gb, h200-141gb, b200-180gb, mi300x-192gb, custom)")
    p.add_argument("--gpu-memory-gb", type=float, help="capacity for --gpu custom, GB")
    p.add_argument("--seq-length", type=int, help="tokens per sample (default 4096 unless --tokens-per-gpu)")
    p.add_argument("--tokens-per-gpu", type=int, help="slime --max-tokens-per-gpu")
    p.add_argument("--mbs", type=int, default=1)
    p.add_argument("--num-microbatches", type=int, help="default 8 x PP")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_search)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, LayoutInputError, PatternError, UsageError, ValueError, ArithmeticError) as exc:
        # ValueError / ArithmeticError: anything else a bad value can provoke (a NaN or infinite
        # --gpu-memory-gb, an unbalanced quote in --also, an over-long integer in a receipt)
        fmt = getattr(args, "format", "text")
        if fmt == "json":
            field = getattr(exc, "field", None)
            sys.stdout.write(json.dumps({"valid": False, "errors": [
                {"code": "bad_input", "message": str(exc), "field": field}]}, indent=2) + "\n")
        sys.stderr.write(f"isplan {args.command}: error: {str(exc).encode('utf-8', 'backslashreplace').decode()}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_VALID


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
