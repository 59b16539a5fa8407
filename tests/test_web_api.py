"""The JSON API mirrors the CLI's JSON; bad input is a 4xx naming the field."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.main import app

client = TestClient(app)


def test_healthz():
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_check_matches_seed_case():
    r = client.get("/api/v1/check", params={"split": "10,10,10,10,10,10,9,9"})
    assert r.status_code == 200
    assert [v["layer"] for v in r.json()["violations"]] == [21, 41, 61, 70]


def test_roles():
    r = client.get("/api/v1/roles", params={"model": "glm-5.2"})
    assert r.json()["num_full"] == 21


def test_bad_input_is_4xx_with_field():
    r = client.get("/api/v1/check", params={"model": "../../etc/passwd", "split": "78"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "model"
    r = client.get("/api/v1/check", params={"split": "1,x"})
    assert r.status_code == 422 and "entry 2" in r.json()["errors"][0]["message"]
    r = client.get("/api/v1/check", params={"pp": "0"})
    assert r.status_code == 422


def test_index_page():
    r = client.get("/")
    assert r.status_code == 200 and "VALID" in r.text
