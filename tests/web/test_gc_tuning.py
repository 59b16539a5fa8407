"""The server process's cyclic collector (app.web.app.lifespan): start-up objects frozen, and young
collections rare enough that a live update does not pay for one each time."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient

from app.web.app import create_app
from app.web.store import ConfigStore

FRAGMENT = "/fragment?model=glm-5.2&mode=split&tp=4&cp=8&ep=32&etp=1&sp=1&tpg=8192&split="
SPLITS = ["14,8,8,8,8,8,8,16", "14,9,7,8,8,8,8,16", "14,10,6,8,8,8,8,16", "14,9,7,8,8,8,8,16"]


def test_live_updates_run_few_young_collections(tmp_path):
    """CPython's default (700 allocations net of frees) ran about one young collection per
    fragment; the server's threshold lets 40 updates pass with a handful."""
    before = gc.get_threshold()
    young = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            young.append(1)

    try:
        with TestClient(create_app(store=ConfigStore(tmp_path / "configs.sqlite3"))) as client:
            assert gc.get_threshold()[0] >= 10_000 and gc.get_freeze_count() > 0
            for i in range(8):
                assert client.get(FRAGMENT + SPLITS[i % 4]).status_code == 200
            gc.callbacks.append(count)
            try:
                for i in range(40):
                    assert client.get(FRAGMENT + SPLITS[i % 4]).status_code == 200
            finally:
                gc.callbacks.remove(count)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert len(young) <= 8, len(young)
