"""Receipts never name a server path, are bounded before any work, and may be signed (issue 9)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path

import pytest

from app.core.layout.stages import PipelineSpec
from app.core.model.config import load_config_bytes, load_preset
from app.core.plan import bounds
from app.core.receipt import (
    ReceiptError,
    build_receipt,
    canonical_body_digest,
    load_receipt_bytes,
    verify_receipt,
)

REPO = Path(__file__).resolve().parents[2]


def _receipt(**kw) -> dict:
    return build_receipt(load_preset("glm-5.2"), [("training", PipelineSpec(pp=8, first=14, last=16), None, None, ())],
                         **kw)


def _resign(r: dict) -> dict:
    r["body_sha256"] = canonical_body_digest(r)
    return r


def test_path_source_is_refused_without_opening_it(tmp_path, monkeypatch):
    secret = tmp_path / "secret.json"
    secret.write_text('{"num_hidden_layers": 5}')
    r = _receipt()
    r["model"]["source"], r["model"]["id"] = "path", str(secret)
    opened: list[str] = []
    real_open = open

    def spy(file, *a, **k):
        opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", spy)
    with pytest.raises(ReceiptError, match="never makes isplan open a path"):
        verify_receipt(_resign(r))
    assert str(secret) not in opened


def test_missing_path_and_existing_path_give_the_same_message(tmp_path, monkeypatch):
    """No existence oracle: the message does not depend on whether the file exists.

    The paths are relative to the working directory, short enough that the message quotes them
    whole (it shortens a long id), and where the file would be found if it were opened."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists.json").write_text("{}")
    messages = []
    for p in ("exists.json", "missing.json"):
        r = _receipt()
        r["model"]["source"], r["model"]["id"] = "path", p
        with pytest.raises(ReceiptError) as exc:
            verify_receipt(_resign(r))
        messages.append(str(exc.value).replace(p, "P"))
    assert messages[0] == messages[1]


def test_upload_source_needs_the_caller_lookup():
    r = _receipt()
    r["model"]["source"], r["model"]["id"] = "upload", "sha256:" + "0" * 64
    with pytest.raises(ReceiptError, match="not stored here; upload"):
        verify_receipt(_resign(r))


def test_explicit_config_still_verifies_a_path_receipt(tmp_path):
    """The CLI user's own --config (config_path / config=) is how a path receipt verifies."""
    path = tmp_path / "config.json"
    path.write_bytes((REPO / "app/core/presets/glm-5.2.json").read_bytes())
    cfg = load_config_bytes(path.read_bytes(), id=str(path), source="path")
    r = build_receipt(cfg, [("training", PipelineSpec(split=(14, 8, 8, 8, 8, 8, 8, 16)), None, None, ())])
    assert r["model"]["source"] == "path"
    assert verify_receipt(r, config_path=str(path))["ok"]
    assert verify_receipt(r, config=cfg)["ok"]
    with pytest.raises(ReceiptError, match="character device"):
        verify_receipt(r, config_path="/dev/zero")


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("mtp_layers", 10**9, "mtp_layers is 1,000,000,000; the limit is 16"),
    ("pp", 257, "pp is 257; the limit is 256"),
    ("vpp", 65, "vpp is 65; the limit is 64"),
    ("first", -1, "cannot be negative"),
    ("split", [14, -8, 8, 8, 8, 8, 8, 16], "split[1] is -8; it cannot be negative"),
    ("split", [100_000_000], "split[0] is 100,000,000; the limit is 4,096"),
    ("split", [1] * (bounds.MAX_STAGES + 1), "at most 65,536"),
    ("layout", "t" * (bounds.MAX_LAYOUT_CHARS + 1), "layout must be a string of at most 100,000"),
])
def test_counts_over_the_bounds_refused_before_work(field, value, needle):
    r = _receipt()
    r["layouts"][0]["inputs"][field] = value
    t0 = time.perf_counter()
    with pytest.raises(ReceiptError) as exc:
        verify_receipt(_resign(r))
    assert needle in str(exc.value)
    assert time.perf_counter() - t0 < 2


def test_too_many_layouts_refused():
    r = _receipt()
    r["layouts"] = r["layouts"] * (bounds.MAX_RECEIPT_LAYOUTS + 1)
    with pytest.raises(ReceiptError, match="limit is 16"):
        verify_receipt(_resign(r))


def test_load_receipt_bytes_bounds():
    with pytest.raises(ReceiptError, match="nests deeper than 64"):
        load_receipt_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ReceiptError, match="nests deeper than 64"):
        load_receipt_bytes(b'{"a":' * 70 + b"1" + b"}" * 70)
    with pytest.raises(ReceiptError, match="limit is 2,097,152 bytes"):
        load_receipt_bytes(b" " * (bounds.MAX_RECEIPT_BYTES + 1))
    with pytest.raises(ReceiptError, match="not JSON"):
        load_receipt_bytes(b"{nope")
    with pytest.raises(ReceiptError, match="cannot be read"):
        load_receipt_bytes(b"1" * 5000)  # over Python's int-digit limit
    assert load_receipt_bytes(json.dumps(_receipt()).encode())["receipt_version"] == 1


# --------------------------------------------------------------------------- HMAC signing

KEY = b"operator secret"


def test_signed_receipt_verifies_with_the_key_and_hmac_is_rfc2104():
    r = _receipt(key=KEY)
    body = {k: v for k, v in r.items() if k not in ("body_sha256", "body_hmac_sha256")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert r["body_hmac_sha256"] == hmac.new(KEY, text, hashlib.sha256).hexdigest()
    assert r["body_sha256"] == hashlib.sha256(text).hexdigest()
    assert verify_receipt(r, key=KEY)["ok"]


def test_edited_label_and_rehashed_fails_with_key_only():
    r = _receipt(key=KEY)
    r["model"]["label"] = "something else"
    _resign(r)  # an editor can recompute the unkeyed hash ...
    assert verify_receipt(r, key=b"")["ok"]  # ... which is all an unkeyed check sees (no key)
    report = verify_receipt(r, key=KEY)  # ... but not the HMAC
    assert not report["ok"]
    assert any("body_hmac_sha256 does not match" in d for d in report["differences"])


def test_unsigned_receipt_is_a_difference_when_a_key_is_configured(monkeypatch):
    r = _receipt(key=b"")
    assert "body_hmac_sha256" not in r
    monkeypatch.setenv("ISPLAN_RECEIPT_KEY", "k")
    report = verify_receipt(r)
    assert not report["ok"] and any("body_hmac_sha256 is missing" in d for d in report["differences"])


def test_signed_receipt_without_key_notes_it(monkeypatch):
    monkeypatch.delenv("ISPLAN_RECEIPT_KEY", raising=False)
    r = _receipt(key=KEY)
    report = verify_receipt(r)
    assert report["ok"]
    assert any("author was not checked" in n for n in report["notes"])


def test_env_key_signs(monkeypatch):
    monkeypatch.setenv("ISPLAN_RECEIPT_KEY", "abc")
    r = _receipt()
    assert r["body_hmac_sha256"] == hmac.new(b"abc", json.dumps(
        {k: v for k, v in r.items() if k not in ("body_sha256", "body_hmac_sha256")},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), hashlib.sha256).hexdigest()
