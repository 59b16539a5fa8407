"""The flags a launcher reader understands: the training engines' own vocabularies, plus one
documented list of the rest.

Every Megatron / slime flag that has a plan field comes from its engine's vocabulary
(``app.core.engines.<name>.flags`` through :func:`app.core.engines.flag_vocabulary`) via
:func:`plan_flags`; nothing here repeats them. :data:`READER_ONLY_FLAGS` lists the flags with no
plan field that an import still needs, each with why; :func:`untimed_flags` the engines' flags
with no plan field that change the step time (read so the import can say the time does not follow
them).
"""

from __future__ import annotations

from functools import cache

from app.core.engines import ENGINES, flag_settings, flag_vocabulary
from app.core.plan import TABLE

#: Flags with no plan field that the reader reads anyway: flag -> (takes a value?, why).
#: Sources: THUDM/slime ``slime/utils/arguments.py`` at 624b824a898ab0ec1fcb4d373004c7f3852bf515
#: (``--actor-num-nodes`` line 39, ``--actor-num-gpus-per-node`` 41, ``--num-gpus-per-node`` 62,
#: ``--allgather-cp`` 297, ``--hf-checkpoint`` 307); NVIDIA/Megatron-LM ``megatron/training/arguments.py``
#: (``--load``, ``--hybrid-layer-pattern`` / ``--hybrid-override-pattern``); torchrun's ``--nnodes`` /
#: ``--nproc-per-node``. (``--cp-comm-type``, ``--allgather-cp``,
#: ``--use-distributed-optimizer`` and ``--recompute-activations`` are plan settings now: the engines'
#: ``flags`` / ``flag_settings``.)
READER_ONLY_FLAGS: dict[str, tuple[bool, str]] = {
    "--actor-num-nodes": (True, "slime: training nodes; x --actor-num-gpus-per-node is the GPU count"),
    "--actor-num-gpus-per-node": (True, "slime: GPUs per training node"),
    "--num-gpus-per-node": (True, "slime: GPUs per node (the GPU count when --actor-num-gpus-per-node is absent)"),
    "--nnodes": (True, "torchrun: nodes; x --nproc-per-node is the GPU count"),
    "--nproc-per-node": (True, "torchrun: processes (GPUs) per node"),
    "--hf-checkpoint": (True, "slime: the HF checkpoint; its config.json is offered as the model (CLI)"),
    "--load": (True, "Megatron: the checkpoint to load; its config.json is offered as the model (CLI)"),
    "--overlap-p2p-communication": (False, "not a Megatron option (overlap is the default): read to warn about it"),
    "--hybrid-layer-pattern": (True, "Megatron: a hybrid model's layers; its | segments are the stage sizes "
                                     "(the engine's launch_pipeline)"),
    "--hybrid-override-pattern": (True, "Megatron: the older name of --hybrid-layer-pattern (arguments.py:744-755)"),
}



@cache
def plan_flags() -> dict[str, bool]:
    """Every engine flag of the plan table -> whether it is a switch (a ``bool`` field, or a switch
    that sets a field to a value: ``--recompute-activations``)."""
    return {**{flag: TABLE[name].kind == "bool" for flag, name in flag_vocabulary().items()},
            **{flag: True for flag in flag_settings()}}


@cache
def list_flags() -> frozenset[str]:
    """Flags that take one or more values (argparse ``nargs='+'``: ``--recompute-modules core_attn mlp``):
    every word after them up to the next flag is read, as one comma list."""
    return frozenset(flag for flag, name in flag_vocabulary().items() if TABLE[name].nargs)


@cache
def untimed_flags() -> dict[str, bool]:
    """Every engine's flags that change the step time but have no plan field
    (:attr:`app.core.engines.base.LaunchSyntax.untimed_flags`) -> whether it takes a value: read so
    the import can say the time does not follow them."""
    return {flag: takes for e in ENGINES.values() for flag, takes, _ in e.launch.untimed_flags}


@cache
def value_flags() -> frozenset[str]:
    """Flags the reader reads a value for: the table's non-boolean flags, the reader-only ones and
    the untimed ones that take a value."""
    return frozenset({f for f, switch in plan_flags().items() if not switch}
                     | {f for f, (takes, _) in READER_ONLY_FLAGS.items() if takes}
                     | {f for f, takes in untimed_flags().items() if takes})


@cache
def switch_flags() -> frozenset[str]:
    """Flags the reader records as present or absent (no value): the table's switches, the
    reader-only ones and the untimed switches."""
    return frozenset({f for f, switch in plan_flags().items() if switch}
                     | {f for f, (takes, _) in READER_ONLY_FLAGS.items() if not takes}
                     | {f for f, takes in untimed_flags().items() if not takes})


def only_flags() -> dict[str, str]:
    """Flag -> the engine it belongs to alone (any of them on the trainer line names the engine)."""
    return {f: e.name for e in ENGINES.values() for f in e.launch.only_flags}
