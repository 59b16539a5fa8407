"""slime (THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515): Megatron-Core plus slime's
own flags and its role rule.

* Roles: ``slime_plugins/models/glm5/glm5.py`` ``is_skip_topk_layer`` - like Megatron's but without
  clamping the offset to 1, so offset 0 makes layer 1 a shared layer with no source. slime reads
  ``index_topk_freq`` / ``index_skip_topk_offset`` from the HF config (no ``--dsa-indexer-*`` flags).
* Flags: ``slime/utils/arguments.py`` adds ``--max-tokens-per-gpu`` (read with
  ``--use-dynamic-batch-size``), ``--allgather-cp`` (the all-gather CP layout DSA needs); the Megatron
  flags it forwards keep Megatron's names. A stage that starts on a shared layer fails the build's
  assertion (and at run time a skip layer whose source did not run in the stage raises).
* Profile: the pinned GLM-5.2 launcher ``scripts/run-glm5.2-744B-A40B.sh`` (TP4 CP8 PP8 first 14 /
  last 16, EP32 ETP1 SP, full uniform recompute of 1 layer, 8192 tokens per GPU, optimizer CPU
  offload with the precision-aware optimizer, no ``--mtp-num-layers``), with its conversion layout
  (TP8 PP2 last 40) in the second slot.
"""

from __future__ import annotations

from typing import Any, ClassVar

from app.core.engines.base import LaunchSyntax
from app.core.engines.megatron import MEGATRON_FLAG_SETTINGS, MEGATRON_FLAGS, MegatronEngine
from app.core.engines.megatron.parallel import RULES, Rule, comm_types, dsa_cp_rule, te_cp_comm_rule
from app.core.engines.rules import ShareBehaviour
from app.core.layout.stages import StagePlan
from app.core.model.config import ModelConfig
from app.core.model.parallelism import Check, ParallelConfig
from app.core.model.roles import RoleRule
from app.core.plan import Plan


def _slime_full(n: int, freq: int, offset: int) -> bool:
    return max(n - offset, 0) % freq == 0


SLIME_RULE = RoleRule("slime", (1, 0), _slime_full, reads_declared=False, mtp_follows_rule=True,
                      source="THUDM/slime slime_plugins/models/glm5/glm5.py is_skip_topk_layer @ 624b824")

SLIME_FLAGS = {**MEGATRON_FLAGS, "--max-tokens-per-gpu": "tokens_per_gpu"}
#: slime's ``--allgather-cp`` (``slime/utils/arguments.py`` line 297) is the all-gather CP layout DSA with
#: CP needs: the plan's ``cp_comm_type`` ``allgather`` (Megatron's own DSA attention reads
#: ``--cp-comm-type allgather`` for the same thing)
SLIME_FLAG_SETTINGS: dict[str, tuple[str, Any]] = {**MEGATRON_FLAG_SETTINGS, "--allgather-cp": ("cp_comm_type", "allgather")}


def allgather_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """``slime/backends/megatron_utils/arguments.py:32-44`` (``_validate_allgather_cp_supported``):
    "--allgather-cp with --context-parallel-size > 1 is currently only supported for DSA attention
    models (DeepSeek-V3.2 and GLM-5.1)" - a non-DSA model would scramble token order."""
    if par.cp == 1 or "allgather" not in comm_types(par) or cfg.has_indexer:
        return []
    return [Check("allgather_cp_non_dsa", False, "--allgather-cp with --context-parallel-size > 1 is currently only "
                  "supported for DSA attention models; non-DSA models still use the zigzag CP layout and would "
                  "silently scramble token order under allgather CP: drop --allgather-cp")]


def dsa_allgather_cp_rule(cfg: ModelConfig, par: ParallelConfig, plan: StagePlan | None) -> list[Check]:
    """slime's GLM-5 model (``--spec slime_plugins.models.glm5.glm5``) is not Megatron's DSA attention: it
    all-gathers the keys over CP itself and needs the sequential all-gather CP layout that
    ``--allgather-cp`` selects ("DSA + context parallel uses the sequential allgather-CP layout (not
    zigzag)", ``scripts/models/glm5.2-744B-A40B.sh``; with it the tokens are cut into contiguous CP
    chunks, without it zigzag-sliced, ``slime/backends/megatron_utils/cp_utils.py:271-284``); Megatron's
    ``--cp-comm-type`` does not select it."""
    if par.cp == 1 or not cfg.has_indexer:
        return []
    if set(comm_types(par)) != {"allgather"}:
        return [Check("dsa_cp", False, f"DSA with CP={par.cp} uses the sequential allgather-CP layout (not zigzag) in "
                                       "slime; add --allgather-cp")]
    return [Check("dsa_cp", True, f"DSA with CP={par.cp}: --allgather-cp")]


SLIME_SHARED_START = ShareBehaviour(
    "crash", True, "slime's GLM-5 model asserts at build that every pipeline stage starts on a layer that computes "
    "its top-k (and a skip layer whose source did not run in the stage raises at run time)",
    "THUDM/slime slime_plugins/models/glm5/glm5.py @ 624b824")

#: The page's plan for an empty query and GLM-5.2's slime profile: ``scripts/run-glm5.2-744B-A40B.sh`` as
#: launched (THUDM/slime @ 624b824, FACTS.md section 1).
SLIME_GLM52_PROFILE = Plan(
    model="glm-5.2", engine="slime", mode="flags", pp=8, first=14, last=16, tp=4, cp=8, ep=32, etp=1, dp=1,
    sp=True, tokens_per_gpu=8192, recompute="full", recompute_method="uniform", recompute_num_layers=1,
    cp_comm_type="allgather",   # the script's --allgather-cp
    optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True, use_precision_aware_optimizer=True,
    conv="flags", conv_pp=2, conv_last=40,
)
#: pinned launchers by the config digest they were written for (the shipped preset's bytes)
PINNED: dict[str, Plan] = {"glm-5.2": SLIME_GLM52_PROFILE}


class SlimeEngine(MegatronEngine):
    """slime: Megatron's placement, acceptance and memory, slime's role rule and flags."""

    name = "slime"
    label = "slime"
    role_rule: ClassVar[RoleRule | None] = SLIME_RULE
    flags: ClassVar[dict[str, str]] = SLIME_FLAGS
    flag_settings: ClassVar[dict[str, tuple[str, Any]]] = SLIME_FLAG_SETTINGS
    #: slime always builds Megatron's distributed optimizer ("always use zero optimizer":
    #: ``slime/backends/megatron_utils/arguments.py:151-153`` sets ``args.use_distributed_optimizer = True``),
    #: so a slime launcher without ``--use-distributed-optimizer`` has one
    absent_defaults: ClassVar[dict[str, Any]] = {}
    #: Megatron's rules with slime's own reading of the all-gather CP layout (``--allgather-cp``) for
    #: Megatron's DSA and Transformer Engine spelling rules
    rules: ClassVar[tuple[Rule, ...]] = (*(r for r in RULES if r not in (dsa_cp_rule, te_cp_comm_rule)),
                                         dsa_allgather_cp_rule, allgather_cp_rule)
    shared_start: ClassVar[ShareBehaviour] = SLIME_SHARED_START
    #: slime's entry points with the ``PERF_ARGS`` array its scripts use, and its own flags
    #: (``slime/utils/arguments.py`` @ 624b824a: ``--actor-num-nodes`` line 39, ``--actor-num-gpus-per-node``
    #: 41, ``--allgather-cp`` 297, ``--hf-checkpoint`` 307, ``--max-tokens-per-gpu`` 758)
    launch: ClassVar[LaunchSyntax] = LaunchSyntax(
        entry_points=("train.py", "train_async.py"), entry_needs_array="PERF_ARGS",
        only_flags=("--actor-num-nodes", "--actor-num-gpus-per-node", "--hf-checkpoint", "--allgather-cp",
                    "--max-tokens-per-gpu"), untimed_flags=MegatronEngine.launch.untimed_flags,
        unread_flags=MegatronEngine.launch.unread_flags, replacing_flags=MegatronEngine.launch.replacing_flags)
    source = "THUDM/slime @ 624b824a898ab0ec1fcb4d373004c7f3852bf515"


    def profile(self, cfg: ModelConfig, plan: Plan) -> Plan:
        """The pinned launcher where slime ships one for this preset (same GPU), else the planner's."""
        pinned = PINNED.get(cfg.id)
        if pinned is not None and plan.gpu == pinned.gpu and plan.gpu_memory_gb is None:
            return pinned
        return super().profile(cfg, plan)


ENGINE = SlimeEngine()
