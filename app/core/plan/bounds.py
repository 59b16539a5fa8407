"""Upper bounds on every count a request, a receipt, a launcher or the CLI may ask for, in one place.

Each adapter (URL, API, form, launcher, receipt, uploaded config, CLI) checks its inputs against
these constants *before* any work, so one request cannot make the planner expand, allocate or
iterate without limit (issue 9: a 9-digit stage size expanded per layer passed 4 GB).

Why these values:

* ``MAX_LAYERS`` - the config loader's own limit on ``num_hidden_layers``
  (:data:`app.core.model.config._LIMITS`); GLM-5.2 has 78, DeepSeek-V3.2 61.
* ``MAX_PP`` / ``MAX_VPP`` - far above any published pipeline (slime trains GLM-5.2 with PP 8,
  THUDM/slime ``scripts/run-glm5.2-744B-A40B.sh``); PP x VPP stays within
  :data:`app.core.layout.pipeline_layout.MAX_STAGES` (16,384).
* ``MAX_STAGE_LAYERS`` - one stage cannot hold more layers than a model has.
* ``MAX_STAGES`` - entries of a ``--split`` list (empty virtual stages are allowed, so the count is
  bounded separately from the layer count).
* ``MAX_MTP_LAYERS`` - GLM-5.2 and DeepSeek-V3.2 ship one MTP layer (``num_nextn_predict_layers``).
* ``MAX_GPUS``, ``MAX_TOP``, ``MAX_CONTEXT`` - the limits the API routes already declared.
* ``MAX_LAYOUT_CHARS`` - the layout parser's own limit (:func:`app.core.layout.pipeline_layout.parse_layout`).
"""

from __future__ import annotations

MAX_LAYERS = 4096
MAX_PP = 256
MAX_VPP = 64
MAX_STAGE_LAYERS = 4096
MAX_STAGES = 65_536
MAX_MTP_LAYERS = 16
MAX_PIPELINE_STAGES = MAX_PP * MAX_VPP  # physical x virtual stages of one layout (16,384)
MAX_GPUS = 1 << 20
MAX_TOP = 100
MAX_CONTEXT = 1 << 24
MAX_LAYOUT_CHARS = 100_000
MAX_PATTERN_CHARS = 100_000
#: Plan fields (app.core.plan): parallel sizes, token counts and text fields of the URL / CLI.
MAX_TP = 1024
MAX_CP = 1024
MAX_EP = 4096
MAX_TOKENS = MAX_CONTEXT
MAX_PLAN_TEXT = 20_000  # a split, layout or conversion split in a URL or on the command line
MAX_PLAN_PATTERN = 4096
MAX_MODEL_ID = 80

#: Receipts: named layouts in one receipt, and its size as JSON.
MAX_RECEIPT_LAYOUTS = 16
MAX_RECEIPT_BYTES = 2 << 20
MAX_RECEIPT_DEPTH = 64

#: Name -> bound, for messages and for adapters that check a dict of counts at once.
COUNT_BOUNDS: dict[str, int] = {
    "num_layers": MAX_LAYERS,
    "pp": MAX_PP,
    "vpp": MAX_VPP,
    "layers_per_vstage": MAX_STAGE_LAYERS,
    "first": MAX_STAGE_LAYERS,
    "last": MAX_STAGE_LAYERS,
    "split_entry": MAX_STAGE_LAYERS,
    "split_stages": MAX_STAGES,
    "mtp_layers": MAX_MTP_LAYERS,
    "gpus": MAX_GPUS,
    "top": MAX_TOP,
    "context": MAX_CONTEXT,
}


class BoundError(ValueError):
    """A count over its bound (or negative); the message names the field, the bound and the fix."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_count(field: str, value: int, bound: int | None = None, *, where: str = "") -> int:
    """Return ``value`` if ``0 <= value <= bound`` (default :data:`COUNT_BOUNDS[field]`), else raise
    :class:`BoundError` naming ``where + field`` and the limit."""
    limit = COUNT_BOUNDS[field] if bound is None else bound
    name = f"{where}{field}"
    shown = f"{value:,}" if value.bit_length() < 64 else "a number over 2**64"
    if value < 0:
        raise BoundError(f"{name} is {shown}; it cannot be negative", field)
    if value > limit:
        raise BoundError(f"{name} is {shown}; the limit is {limit:,}", field)
    return value

#: Arrays and objects an uploaded ``config.json`` may hold, counted as ``[`` and ``{`` bytes before
#: it is parsed (an upper bound: brackets inside strings count too). A config has a few dozen; a
#: megabyte of ``[[0],[0],...]`` has 262,000 and cost about a second of the server's CPU before it
#: was refused (issue 20). Long flat arrays (100,000 numbers) stay accepted.
MAX_CONFIG_CONTAINERS = 4096
