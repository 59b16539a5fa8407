"""Shared test helpers: synthetic configs built in the test, never by the code under test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Starlette's TestClient names its host "testserver", and a browser test reaches the server as
# "isplan.test" (a plain-HTTP host name that is not loopback): allow them as an operator allows
# their own host names (ISPLAN_ALLOWED_HOSTS); any other name is still a 400
# (tests/web/test_security_round3.py).
os.environ.setdefault("ISPLAN_ALLOWED_HOSTS", "testserver,isplan.test")

from app.core.model.config import load_config_bytes
from app.core.model.parallelism import ParallelConfig

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

# The GLM-5.2 full layers as printed in seed 000 ("Derive full and shared layers").
GLM52_FULL = [1, 2, 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75]


def tiny_config(num_layers: int = 8, **fields) -> dict:
    """A small DSA config with tiny dimensions; fields override the defaults."""
    cfg = {
        "model_type": "glm_moe_dsa",
        "num_hidden_layers": num_layers,
        "hidden_size": 64,
        "vocab_size": 1000,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "index_n_heads": 2,
        "index_head_dim": 8,
        "index_topk": 16,
        "num_nextn_predict_layers": 1,
    }
    cfg.update(fields)
    return cfg


def make_config(raw: dict, id: str = "tiny"):
    data = json.dumps(raw).encode()
    return load_config_bytes(data, id=id, source="upload")


@pytest.fixture
def tmp_config(tmp_path):
    def write(raw: dict | str | bytes, name: str = "config.json") -> Path:
        p = tmp_path / name
        if isinstance(raw, dict):
            p.write_text(json.dumps(raw))
        elif isinstance(raw, str):
            p.write_text(raw)
        else:
            p.write_bytes(raw)
        return p

    return write


def slime_par(**over) -> ParallelConfig:
    """The slime GLM-5.2 training launch (THUDM/slime scripts/run-glm5.2-744B-A40B.sh as quoted in
    FACTS.md section 1), written out here as test input; ``over`` changes single flags. Its
    ``--allgather-cp`` is Megatron's ``--cp-comm-type allgather``; slime always builds the distributed
    optimizer (slime/backends/megatron_utils/arguments.py:151-153)."""
    fields = dict(tp=4, cp=8, pp=8, gpus=256, ep=32, etp=1, sp=True, mbs=1, tokens_per_gpu=8192,
                  recompute="full", recompute_method="uniform", recompute_num_layers=1,
                  optimizer_cpu_offload=True, use_precision_aware_optimizer=True, gpu="h100-80gb",
                  cp_comm_type="allgather", distributed_optimizer=True)
    fields.update(over)
    return ParallelConfig(**fields)


def app_client(store_dir: Path, **client_kw):
    """The real web app (``create_app``) with its config store in ``store_dir``, as a TestClient;
    the store is ``client.app.state.store``."""
    from fastapi.testclient import TestClient

    from app.web.app import create_app
    from app.web.store import ConfigStore

    return TestClient(create_app(store=ConfigStore(store_dir / "configs.sqlite3")), **client_kw)


@pytest.fixture(scope="module")
def client(request, tmp_path_factory):
    """The one app/client fixture: the real web app (``create_app``) on a fresh config store, one
    per test module, as a TestClient. A module that needs other client options states them once as
    ``CLIENT_OPTIONS`` (e.g. ``dict(follow_redirects=False)`` to see a 303, or
    ``dict(raise_server_exceptions=False)`` to see a 500 as a response)."""
    options = getattr(request.module, "CLIENT_OPTIONS", {})
    name = request.module.__name__.rsplit(".", 1)[-1]
    return app_client(tmp_path_factory.mktemp(name), **options)
