"""The plan: every setting of a plan, defined once (:mod:`.table`), and its adapters - the URL
(:mod:`.query`), the CLI (:mod:`.cli`) and an engine's command line (:mod:`.flags`). Bounds are in
:mod:`.bounds`."""

from app.core.plan.cli import GROUP_TITLES, add_cli_arguments, add_cli_fields, given_fields, plan_from_cli
from app.core.plan.flags import plan_from_flags
from app.core.plan.query import IgnoredFields, plan_from_query, strict_plan, unknown_keys
from app.core.plan.table import (
    BY_URL,
    CONVERSION_MODES,
    ENGINES,
    GPUS,
    KV_DTYPES,
    LAYOUT_MODES,
    NEUTRAL_VALUES,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    TABLE,
    WEIGHT_DTYPES,
    Field,
    FieldProblem,
    Plan,
    PlanError,
    applies,
    build_plan,
    derived_conv,
    derived_mode,
    encode_query,
    format_value,
    ignored_fields,
    label,
    mode_note,
    parse_int,
    parse_sizes,
    parse_value,
    parse_values,
    plan_conflicts,
    states_parallelism,
)

__all__ = [
    "BY_URL", "CONVERSION_MODES", "ENGINES", "GPUS", "GROUP_TITLES", "KV_DTYPES", "LAYOUT_MODES", "NEUTRAL_VALUES",
    "RECOMPUTE", "RECOMPUTE_METHODS", "TABLE", "WEIGHT_DTYPES", "Field", "FieldProblem", "IgnoredFields", "Plan",
    "PlanError", "add_cli_arguments", "add_cli_fields", "applies", "build_plan", "derived_conv", "derived_mode", "encode_query",
    "format_value", "given_fields", "ignored_fields", "label", "mode_note", "parse_int", "parse_sizes",
    "parse_value", "parse_values", "plan_conflicts", "plan_from_cli", "plan_from_flags", "plan_from_query",
    "states_parallelism", "strict_plan", "unknown_keys",
]
