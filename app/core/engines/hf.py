"""hf: Megatron's stage placement with the roles transformers reads from the checkpoint.

transformers' ``glm_moe_dsa`` (huggingface/transformers ``models/glm_moe_dsa/configuration_glm_moe_dsa.py``
@ 008e574391258935f3ecc3035c882e73bbcac419) reads ``indexer_types``, then ``index_topk_pattern``, then
``index_topk_freq`` / ``index_skip_topk_offset`` (defaults 1 / 2); its newest modeling raises
``ValueError`` when a shared layer gets no top-k. This engine answers "would these stages be valid
under the checkpoint's own roles": the what-if beside Megatron's and slime's freq/offset readings.
Megatron's ``--dsa-indexer-*`` flags do not apply to it.
"""

from __future__ import annotations

from typing import ClassVar

from app.core.engines.megatron import MEGATRON_FLAGS, TRAINING_FIELDS, MegatronEngine
from app.core.engines.rules import ShareBehaviour
from app.core.model.roles import TRANSFORMERS_RULE, RoleRule
from app.core.plan import Plan

HF_SHARED_START = ShareBehaviour(
    "crash", True, "transformers raises ValueError when a shared layer gets no top-k from its source layer",
    "huggingface/transformers models/glm_moe_dsa/modeling_glm_moe_dsa.py")

HF_FLAGS = {k: v for k, v in MEGATRON_FLAGS.items() if v not in ("dsa_topk_freq", "dsa_skip_topk_offset")}


class HfEngine(MegatronEngine):
    name = "hf"
    label = "transformers roles (Megatron placement)"
    role_rule: ClassVar[RoleRule | None] = TRANSFORMERS_RULE
    fields = TRAINING_FIELDS - {"dsa_topk_freq", "dsa_skip_topk_offset"}
    flags: ClassVar[dict[str, str]] = HF_FLAGS
    shared_start: ClassVar[ShareBehaviour] = HF_SHARED_START
    source = "huggingface/transformers @ 008e574391258935f3ecc3035c882e73bbcac419"

    def overrides(self, plan: Plan) -> tuple[int | None, int | None]:
        return None, None   # the checkpoint's own freq/offset


ENGINE = HfEngine()
