"""The flags a launcher reader understands: the plan table's, plus one documented list of the rest.

Every Megatron / slime flag that has a plan field comes from the table (:data:`app.core.plan.FLAG_FIELDS`,
each field's ``megatron`` and ``slime`` names) through :func:`plan_flags`; nothing here repeats them.
:data:`READER_ONLY_FLAGS` lists the flags with no plan field that an import still needs, each with why.
"""

from __future__ import annotations

from functools import cache

from app.core.plan import FLAG_FIELDS, TABLE

#: Flags with no plan field that the reader reads anyway: flag -> (takes a value?, why).
#: Sources: THUDM/slime ``slime/utils/arguments.py`` at 624b824a898ab0ec1fcb4d373004c7f3852bf515
#: (``--actor-num-nodes`` line 39, ``--actor-num-gpus-per-node`` 41, ``--num-gpus-per-node`` 62,
#: ``--allgather-cp`` 297, ``--hf-checkpoint`` 307); NVIDIA/Megatron-LM ``megatron/training/arguments.py``
#: (``--load``, ``--cp-comm-type``, ``--use-distributed-optimizer``); torchrun's ``--nnodes`` /
#: ``--nproc-per-node``.
READER_ONLY_FLAGS: dict[str, tuple[bool, str]] = {
    "--actor-num-nodes": (True, "slime: training nodes; x --actor-num-gpus-per-node is the GPU count"),
    "--actor-num-gpus-per-node": (True, "slime: GPUs per training node"),
    "--num-gpus-per-node": (True, "slime: GPUs per node (the GPU count when --actor-num-gpus-per-node is absent)"),
    "--nnodes": (True, "torchrun: nodes; x --nproc-per-node is the GPU count"),
    "--nproc-per-node": (True, "torchrun: processes (GPUs) per node"),
    "--hf-checkpoint": (True, "slime: the HF checkpoint; its config.json is offered as the model (CLI)"),
    "--load": (True, "Megatron: the checkpoint to load; its config.json is offered as the model (CLI)"),
    "--cp-comm-type": (True, "Megatron: the CP layout (allgather is what DSA with CP needs), reported"),
    "--allgather-cp": (False, "slime: the all-gather CP layout (Megatron's --cp-comm-type allgather), reported"),
    "--use-distributed-optimizer": (False, "Megatron: the distributed optimizer (the planner's default), reported"),
    "--overlap-p2p-communication": (False, "not a Megatron option (overlap is the default): read to warn about it"),
}

#: slime's own flags (no Megatron meaning): any of them on the trainer line means the script is a
#: slime launcher (THUDM/slime ``slime/utils/arguments.py`` at 624b824a, the lines above; the plan
#: table's ``slime`` names, e.g. ``--max-tokens-per-gpu`` line 758, join them in :func:`slime_flags`).
SLIME_READER_FLAGS = ("--actor-num-nodes", "--actor-num-gpus-per-node", "--hf-checkpoint", "--allgather-cp")


@cache
def plan_flags() -> dict[str, bool]:
    """Every engine flag of the plan table -> whether it is a switch (a ``bool`` field)."""
    return {flag: TABLE[name].kind == "bool" for flag, name in FLAG_FIELDS.items()}


@cache
def value_flags() -> frozenset[str]:
    """Flags the reader reads a value for: the table's non-boolean flags and the reader-only ones."""
    return frozenset({f for f, switch in plan_flags().items() if not switch}
                     | {f for f, (takes, _) in READER_ONLY_FLAGS.items() if takes})


@cache
def switch_flags() -> frozenset[str]:
    """Flags the reader records as present or absent (no value)."""
    return frozenset({f for f, switch in plan_flags().items() if switch}
                     | {f for f, (takes, _) in READER_ONLY_FLAGS.items() if not takes})


@cache
def slime_flags() -> frozenset[str]:
    """slime-only flags: the table's ``slime`` names and :data:`SLIME_READER_FLAGS`."""
    return frozenset({f for spec in TABLE.values() for f in spec.slime} | set(SLIME_READER_FLAGS))
