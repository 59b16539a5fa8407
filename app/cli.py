"""``isplan``: the command-line shell over :mod:`app.core`.

Every plan option is generated from the plan table (:mod:`app.core.plan`); every command prints
one report (:mod:`app.core.reports`), the same object its ``/api/v1`` twin returns.

Exit codes (every subcommand): 0 when the answer's verdict is go, 1 when it is no-go (an invalid
layout, a failing constraint, a rank over capacity, a GPU budget mismatch, a model disagreement,
a receipt that does not verify), 2 for input that cannot be read or used. ``check`` imports only
the core (no web stack, no pydantic, no plotting), so it can run inside a launch script as a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from app import __version__
from app.core.layout.stages import LayoutInputError
from app.core.model.config import ConfigError, ModelConfig, load_model, model_argument, preset_ids
from app.core.model.roles import PatternError
from app.core.plan import TABLE, Plan, PlanError, add_cli_arguments, add_cli_fields, parse_sizes
from app.core.plan import plan_from_cli as _plan_from_cli
from app.core.reports import Report

EXIT_GO, EXIT_NO_GO, EXIT_USAGE = 0, 1, 2
MAX_INPUT_BYTES = 1 << 20


class UsageError(Exception):
    """Bad input detected after argparse (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own usage errors: exit 2
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _out(fmt: str, body: dict[str, Any], lines: list[str]) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        # a string from a hostile input may hold lone surrogates: print them escaped, never crash
        sys.stdout.write(("\n".join(lines) + "\n").encode("utf-8", "backslashreplace").decode("utf-8"))


def _emit(args: argparse.Namespace, report: Report) -> int:
    _out(args.format, report.body, report.lines)
    return EXIT_GO if report.go else EXIT_NO_GO


def _read_text(path: str, what: str = "input file") -> str:
    """A whole input file (``-``: stdin) as UTF-8 text, at most 1 MiB; FIFOs, devices and
    directories refused before a byte is read (:func:`app.core.inputs.read_text_bounded`).
    Any unreadable input is a one-line usage error (exit 2)."""
    from app.core.inputs import InputError, read_text_bounded

    try:
        return read_text_bounded(path, limit=MAX_INPUT_BYTES, what=what)
    except InputError as exc:
        raise UsageError(str(exc)) from None


# ----------------------------------------------------------------------------- plans from flags
def _model_arg(p: argparse.ArgumentParser, optional: bool = False) -> None:
    help_ = (f"a preset id ({', '.join(preset_ids())}; in any case, or its Hugging Face repository such as "
             "meta-llama/Llama-3.1-405B) or a path to an HF config.json")
    if optional:
        p.add_argument("model", metavar="MODEL", nargs="?", default="glm-5.2", help=help_ + " (default glm-5.2)")
    else:
        p.add_argument("model", metavar="MODEL", help=help_)


def _launcher_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--launcher", metavar="FILE",
                   help="a bash launcher script (- for stdin): its flags become the plan (never executed); "
                        "parallel and memory flags given here override the script's, and its engine (slime, megatron, "
                        "vllm, sglang) is the plan's unless --engine is given")


def plan_from_cli(args: argparse.Namespace, model: str) -> Plan:
    """The plan of the command line: every field strict, including the settings the plan's engine
    does not read ("does not apply to engine vllm; drop it")."""
    from app.core.engines import ignored_fields

    return _plan_from_cli(args, model, ignored=ignored_fields)


def _aliases() -> dict[str, list[str]]:
    from app.core.engines import cli_aliases

    return cli_aliases()


def _settings() -> dict[str, list[tuple[str, Any]]]:
    from app.core.engines import cli_settings

    return cli_settings()


def _plan(args: argparse.Namespace, cfg: ModelConfig) -> tuple[Plan, dict[str, Any]]:
    """The plan the flags (and a launcher) describe, plus what ``evaluate`` needs from a launcher."""
    plan = plan_from_cli(args, args.model)
    launcher = getattr(args, "launcher", None)
    if launcher is None:
        return plan, {}
    from app.core.launcher import LauncherImportError, import_launcher

    layout_given = [TABLE[n].cli for n, s in TABLE.items()
                    if s.group == "layout" and s.cli and getattr(args, n, None) is not None]
    if layout_given:
        raise UsageError(f"--launcher reads every pipeline flag from the script; drop {', '.join(map(str, layout_given))}")
    base = Plan(model=plan.model, engine=plan.engine, pattern=plan.pattern)
    keep = getattr(args, "engine", None) is not None  # the script's engine unless --engine is given
    try:
        if launcher == "-":
            imported = import_launcher(_read_text(launcher), cfg, base, keep_engine=keep)
        else:  # read from disk with the files it sources beside it
            imported = import_launcher(_read_text(launcher), cfg, base, path=launcher, keep_engine=keep)
    except LauncherImportError as exc:
        raise UsageError(str(exc)) from None
    overrides = {n: getattr(plan, n) for n, s in TABLE.items()
                 if s.group not in ("layout",) and getattr(args, n, None) is not None}
    merged = replace(imported.plan, **overrides)
    # what the reading itself noticed goes beside the verdict (JSON: launcher.warnings; text: stderr),
    # so the verdict is the plan's own, the same as the URL the plan becomes
    for w in imported.warnings:
        sys.stderr.write(f"warning: {w}\n")
    report = {**imported.report, "warnings": list(imported.warnings)}
    if imported.candidate_config is not None:
        report["candidate_config"] = imported.candidate_config
        if os.path.abspath(args.model) != os.path.abspath(imported.candidate_config):
            sys.stderr.write(f"note: the launcher's checkpoint has {imported.candidate_config}; check against it "
                             f"with: isplan {args.command} {imported.candidate_config} --launcher {launcher}\n")
    extra = {"extra_errors": imported.errors, "extra": {"launcher": report}}
    return merged, extra


def _load(args: argparse.Namespace) -> ModelConfig:
    return load_model(args.model)


# ----------------------------------------------------------------------------- commands
def cmd_check(args: argparse.Namespace) -> int:
    from app.core.reports import check_report

    cfg = _load(args)
    plan, extra = _plan(args, cfg)
    layout_args = ("split", "pp", "layout", "ici_pipeline_parallelism", "dcn_pipeline_parallelism",
                   "layers_per_pipeline_stage")
    if args.launcher is None and not any(getattr(args, n, None) is not None for n in layout_args):
        raise UsageError("give a layout: --split LIST, --pp N [flags], --pp N --layout STR, or --launcher FILE")
    return _emit(args, check_report(plan, cfg, **extra))


def cmd_roles(args: argparse.Namespace) -> int:
    from app.core.reports import roles_command_report

    cfg = _load(args)
    return _emit(args, roles_command_report(plan_from_cli(args, args.model), cfg))


def cmd_params(args: argparse.Namespace) -> int:
    from app.core.reports import params_report

    cfg = _load(args)
    plan, _ = _plan(args, cfg)
    with_layout = args.launcher is not None or plan.states_layout
    return _emit(args, params_report(plan, cfg, per_layer=args.per_layer, with_layout=with_layout))


def cmd_memory(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.inference:
        from app.core.reports import inference_report

        plan = plan_from_cli(args, args.model)
        return _emit(args, inference_report(plan, cfg, context=plan.context, batch=plan.concurrency,
                                            kv_dtype=plan.kv_dtype, weight_dtype=plan.weight_dtype,
                                            dp_attention=args.whole_model_dp_attention, include_mtp=args.include_mtp))
    from app.core.reports import memory_report

    plan, extra = _plan(args, cfg)
    return _emit(args, memory_report(plan, cfg, **extra))


def cmd_time(args: argparse.Namespace) -> int:
    from app.core.reports import time_report

    cfg = _load(args)
    plan, extra = _plan(args, cfg)
    return _emit(args, time_report(plan, cfg, timeline=args.timeline, **extra))


def cmd_flops(args: argparse.Namespace) -> int:
    from app.core.reports import flops_command_report

    cfg = _load(args)
    return _emit(args, flops_command_report(plan_from_cli(args, args.model), cfg))


def _top(args: argparse.Namespace) -> int:
    if not 0 <= args.top <= 100:
        raise UsageError(f"--top must be between 0 and 100, got {args.top}")
    return int(args.top)


def cmd_plan(args: argparse.Namespace) -> int:
    from app.core.reports import plan_search_report

    cfg = _load(args)
    if args.pp is None:
        raise UsageError("isplan plan needs --pp N (the pipeline ranks to plan for)")
    plan = plan_from_cli(args, args.model)
    near = parse_sizes(args.near, "--near") if args.near is not None else None
    return _emit(args, plan_search_report(plan, cfg, objective=args.objective, top=_top(args), near=near,
                                          model_arg=args.model))


def cmd_search(args: argparse.Namespace) -> int:
    from app.core.reports import search_report

    cfg = _load(args)
    plan = plan_from_cli(args, args.model)
    if plan.gpus is None:
        raise UsageError("isplan search needs --gpus N (the GPU budget)")
    return _emit(args, search_report(plan, cfg, gpus=plan.gpus, top=_top(args), model_arg=args.model,
                                     pareto=args.pareto))


def _also_layouts(args: argparse.Namespace, plan: Plan) -> list[tuple[str, Any]]:
    import shlex

    from app.core.engines.megatron import pipeline_spec

    out: list[tuple[str, Any]] = []
    for item in args.also or []:
        name, sep, rest = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--also takes NAME=ARGS, e.g. 'conversion=--pp 2 --last 40'; got {item!r}")
        sub = _Parser(prog=f"isplan receipt --also {name}", add_help=False)
        add_cli_fields(sub, [n for n, s in TABLE.items() if s.group == "layout" and s.cli], _aliases())
        try:
            sub_args = sub.parse_args(shlex.split(rest))
        except SystemExit:
            raise UsageError(f"--also {name}: cannot parse {rest!r}") from None
        sub_plan = plan_from_cli(sub_args, args.model)
        out.append((name.strip(), (name.strip(), pipeline_spec(sub_plan), plan.dsa_topk_freq,
                                   plan.dsa_skip_topk_offset, ())))
    return out


def cmd_receipt(args: argparse.Namespace) -> int:
    from app.core.reports import receipt_report

    cfg = _load(args)
    plan, _ = _plan(args, cfg)
    also = _also_layouts(args, plan)
    names = [args.name] + [n for n, _ in also] + (["conversion"] if plan.conv != "none" else [])
    if len(set(names)) != len(names):
        raise UsageError(f"layout names must differ; got {names}")
    report = receipt_report(plan, cfg, name=args.name, also=[entry for _, entry in also],
                            model_revision=args.model_revision, engine_commit=args.engine_commit)
    sys.stdout.write(json.dumps(report.body, indent=2) + "\n")
    for w in report.body.get("warnings", []):
        sys.stderr.write(f"warning: {w}\n")
    return EXIT_GO if report.go else EXIT_NO_GO


def cmd_verify(args: argparse.Namespace) -> int:
    from app.core.receipt import ReceiptError, load_receipt_bytes, verify_receipt

    try:
        receipt = load_receipt_bytes(_read_text(args.receipt, "receipt"))
        report = verify_receipt(receipt, config_path=args.config)
    except ReceiptError as exc:
        raise UsageError(str(exc)) from None
    lines = [("VERIFIED: " if report["ok"] else "DIFFERS: ") + report["summary"]]
    lines += [f"- {d}" for d in report["differences"]]
    _out(args.format, report, lines)
    return EXIT_GO if report["ok"] else EXIT_NO_GO


# ----------------------------------------------------------------------------- the parser
def _fmt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text")


def _command(sub: Any, name: str, func: Any, help: str, *, description: str | None = None,
             model: str = "required", launcher: bool = True) -> argparse.ArgumentParser:
    """A subcommand that takes the model and every plan field (and, where it reads one, a launcher)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description or help)
    if model != "none":
        _model_arg(p, optional=model == "optional")
    add_cli_arguments(p, _aliases(), _settings())
    if launcher:
        _launcher_arg(p)
    p.set_defaults(func=func)
    return p


def _add_check(sub: Any, help: str) -> None:
    p = _command(sub, "check", cmd_check, help,
                 description="Materialise the stages the engine would build and check each start. With any "
                             "parallel/memory flag, --gpu or a launcher, the GPU count, the parallel constraints "
                             "and per-rank memory join the verdict (serving engines always judge memory).")
    _fmt(p)


def _add_roles(sub: Any, help: str) -> None:
    _fmt(_command(sub, "roles", cmd_roles, help, launcher=False))


def _add_receipt(sub: Any, help: str) -> None:
    p = _command(sub, "receipt", cmd_receipt, help)
    p.add_argument("--name", default="training", help="name of the layout given by the flags (default: training)")
    p.add_argument("--also", action="append", metavar="NAME=ARGS",
                   help="another named layout, e.g. --also 'conversion=--pp 2 --last 40' (repeatable)")
    p.add_argument("--model-revision", metavar="REV", help="immutable model revision (40-hex commit)")
    p.add_argument("--engine-commit", metavar="SHA", help="Megatron/slime commit the job runs (40-hex)")


def _add_verify(sub: Any, help: str) -> None:
    p = sub.add_parser("verify", help=help)
    p.add_argument("receipt", metavar="RECEIPT", help="receipt JSON file (- for stdin)")
    p.add_argument("--config", metavar="PATH", help="config.json to verify against (default: the receipt's preset)")
    _fmt(p)
    p.set_defaults(func=cmd_verify)


def _add_params(sub: Any, help: str) -> None:
    p = _command(sub, "params", cmd_params, help)
    p.add_argument("--per-layer", action="store_true", help="include one entry per decoder layer")
    _fmt(p)


def _add_memory(sub: Any, help: str) -> None:
    p = _command(sub, "memory", cmd_memory, help,
                 description="Memory per GPU of every pipeline rank (training: beside Megatron's own estimate; "
                             "vllm/sglang: weights + KV cache); exit 1 when the verdict is no-go (e.g. a rank "
                             "overflows the GPU). --inference: the whole model on one TP group, at --context and "
                             "--concurrency with --kv-dtype / --weight-dtype.")
    g = p.add_argument_group("inference (--inference)")
    g.add_argument("--inference", action="store_true", help="serving memory of the whole model: weights + KV cache")
    g.add_argument("--dp-attention", action="store_true", dest="whole_model_dp_attention",
                   help="the attention replicated on every GPU of the TP group (data-parallel attention at DP = TP)")
    g.add_argument("--include-mtp", action="store_true", help="serve the MTP layer (its KV and weights)")
    _fmt(p)


def _add_time(sub: Any, help: str) -> None:
    p = _command(sub, "time", cmd_time, help,
                 description="The step time of the plan on --gpu at --precision: per-layer op costs, communication "
                             "on the link it uses (NVLink inside the domain, the network across), the 1F1B / "
                             "interleaved schedule simulated from each stage's own costs, the data-parallel "
                             "reduce-scatter / all-gather and the optimizer step (docs/MODELS.md, 'Step time').")
    p.add_argument("--timeline", action="store_true", help="include the simulated schedule (every micro-batch)")
    _fmt(p)


def _add_flops(sub: Any, help: str) -> None:
    _fmt(_command(sub, "flops", cmd_flops, help, launcher=False))


def _add_plan(sub: Any, help: str) -> None:
    p = _command(sub, "plan", cmd_plan, help,
                 description="The exact best valid layouts for --pp (x --vpp) as the engine builds them "
                             "(Megatron/slime: min-max layout; vLLM/SGLang: serving partition), each evaluated "
                             "like any plan, with its verdict and the isplan check line that reproduces it.",
                 launcher=False)
    p.add_argument("--objective", choices=("compute", "memory", "balanced", "time"), default="balanced",
                   help="what the best layout minimises: the busiest stage's compute, parameters, both, or the "
                        "simulated step time (time: with the plan's parallel settings and --gpu)")
    p.add_argument("--top", type=int, default=3, metavar="K", help="alternatives after the best (0-100, default 3)")
    p.add_argument("--near", metavar="LIST", help="also give the valid layout closest to this split")
    _fmt(p)


def _add_search(sub: Any, help: str) -> None:
    p = _command(sub, "search", cmd_search, help, model="optional", launcher=False)
    p.add_argument("--top", type=int, default=10, metavar="K", help="configurations to list (0-100, default 10)")
    p.add_argument("--pareto", action="store_true",
                   help="also the Pareto frontier of GPUs x tokens/s/GPU x memory headroom (this budget and each "
                        "smaller power of two)")
    _fmt(p)


#: every subcommand, in ``isplan --help`` order: its one-line help and what adds its parser
COMMANDS: dict[str, tuple[str, Any]] = {
    "check": ("the plan's verdict: stages, boundary, acceptance (+ parallelism, memory)", _add_check),
    "roles": ("per-layer full/shared roles, sources and disagreements", _add_roles),
    "receipt": ("write a verifiable JSON receipt for the plan's layouts", _add_receipt),
    "verify": ("recompute a receipt and report every difference", _add_verify),
    "params": ("parameter counts: totals, active, per component, per stage and GPU", _add_params),
    "memory": ("memory per GPU per pipeline rank (or --inference)", _add_memory),
    "time": ("how fast the plan trains: step time, tokens/s/GPU, MFU, breakdown", _add_time),
    "flops": ("per-token forward FLOPs with and without IndexShare", _add_flops),
    "plan": ("the best valid layouts for PP (x VPP), each with its verdict", _add_plan),
    "search": ("rank parallel configurations for a GPU budget (--gpus)", _add_search),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """``isplan``'s parser. With ``only`` (a command name), only that subcommand gets its options
    (every plan field: a few hundred ``add_argument`` calls per command); the others are listed
    by name and help, so a launch script's ``isplan check`` builds one command, not ten."""
    parser = _Parser(
        prog="isplan",
        description="IndexShare layout planner: validate that every physical and virtual pipeline "
                    "stage of a GLM-5.2-class model starts on a full (index-computing) layer, and that the "
                    "plan's parallelism, GPU count and memory hold. Every command takes every plan setting; "
                    "each option's help names its URL key (the page's query string).",
        epilog="Exit codes: 0 go, 1 no-go (the verdict lists each blocking reason), 2 bad input or usage.",
    )
    parser.add_argument("--version", action="version", version=f"isplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_, add) in COMMANDS.items():
        if only in (None, name):
            add(sub, help_)
        else:
            sub.add_parser(name, help=help_)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, when its first word is one (the top-level options,
    ``--help`` and ``--version``, take no value); else None (argparse then says what is wrong)."""
    first = next(iter(argv), None)
    return first if first in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command_named(argv)).parse_args(argv)
    try:
        if isinstance(getattr(args, "model", None), str):  # a preset named by its repository or in another case
            args.model = model_argument(args.model)
        return int(args.func(args))
    except (ConfigError, LayoutInputError, PatternError, PlanError, UsageError, ValueError, ArithmeticError,
            MemoryError, RecursionError) as exc:
        # ValueError / ArithmeticError: anything else a bad value can provoke (a NaN or infinite
        # --gpu-memory-gb, an unbalanced quote in --also, an over-long integer in a receipt)
        fmt = getattr(args, "format", "text")
        message = str(exc) or type(exc).__name__
        if fmt == "json":
            problems = getattr(exc, "problems", None)
            errors = ([{"code": "bad_input", "message": p.message, "field": p.field} for p in problems]
                      if problems else [{"code": "bad_input", "message": message, "field": getattr(exc, "field", None)}])
            sys.stdout.write(json.dumps({"valid": False, "errors": errors}, indent=2) + "\n")
        sys.stderr.write(f"isplan {args.command}: error: {message.encode('utf-8', 'backslashreplace').decode()}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_GO


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
