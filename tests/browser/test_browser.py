"""The dashboard in a real browser: the app under uvicorn, Debian's Chromium through Playwright.

The fixtures (one app server and one Chromium per module, watched pages) are in this folder's
``conftest.py``; reading and moving the page is ``dashboard.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from browser_support import AppServer, wait_for_figures
from dashboard import (
    DEFAULT_STARTS,
    GLM52_FULL,
    HOSTILE,
    PRESET,
    PROFILE_PARALLEL,
    boundaries,
    boundary,
    cell,
    drag_boundary,
    focused_boundary,
    form_values,
    query,
    settle,
    updated,
    verdict,
    violations,
)
from playwright.sync_api import expect

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]  # Chromium and a live server: run on its own

# --------------------------------------------------------------------------- tests


def test_harness_reports_csp_violations(open_page):
    """The error collector itself: an inline script is refused by the CSP and seen as a console error."""
    page = open_page("/")
    with page.expect_console_message(lambda m: m.type == "error", timeout=5000):
        page.evaluate("""() => { const s = document.createElement('script');
            s.textContent = 'window.__inline = 1'; document.body.appendChild(s); }""")
    assert page.evaluate("() => window.__inline === undefined"), "the CSP let an inline script run"
    errors = list(page.watch.console_errors)
    assert any("Content Security Policy" in e for e in errors), errors
    page.watch.console_errors.clear()


def test_default_page(open_page):
    page = open_page("/")
    assert verdict(page).startswith("GO"), verdict(page)
    expect(page.locator("#gpu-count")).to_have_text("TP 4 × CP 8 × PP 8 × DP 1 = 256 GPUs")
    decoder = page.locator("#layer-map .cell:not(.mtp)")
    assert decoder.count() == 78
    assert page.locator("#layer-map .cell.mtp").count() == 0  # the slime launcher has no --mtp-num-layers
    full = page.evaluate("""() => Array.from(document.querySelectorAll('#layer-map .cell.full:not(.mtp)'))
        .map(c => Number(c.dataset.layer))""")
    assert full == GLM52_FULL
    assert cell(page, 4).locator(".letter").inner_text() == "S" and cell(page, 7).locator(".letter").inner_text() == "F"
    assert page.locator("#layer-map .cell.invalid").count() == 0

    bs = page.locator("#layer-map .boundary")
    assert bs.count() == 7
    assert boundaries(page) == [(str(k), start) for k, start in enumerate(DEFAULT_STARTS, start=2)]
    rows = page.locator("#stage-table tbody tr")
    for i in range(7):
        b = bs.nth(i)
        assert b.get_attribute("role") == "slider" and b.get_attribute("tabindex") == "0"
        stage = int(b.get_attribute("data-stage"))
        row_range = rows.nth(stage - 1).locator("td").nth(1).inner_text()  # "15–22"
        assert int(re.split(r"\D", row_range)[0]) == int(b.get_attribute("aria-valuenow")), (stage, row_range)
        assert cell(page, int(b.get_attribute("aria-valuenow"))).get_attribute("class").split().count("start") == 1

    assert page.locator(".plotly-figure .main-svg").count() >= 4
    assert page.locator("#violations li.okline").count() == 1


def test_keyboard_moves_a_boundary(open_page):
    page = open_page("/")
    b3 = boundary(page, 3)
    expect(b3).to_have_attribute("aria-valuenow", "23")
    b3.focus()
    updated(page, lambda: page.keyboard.press("ArrowLeft"))
    expect(page).to_have_url(re.compile(r"split=14%2C7%2C9%2C8%2C8%2C8%2C8%2C16"))
    q = query(page)
    assert q["split"] == "14,7,9,8,8,8,8,16" and "layout" not in q, page.url
    assert verdict(page).startswith("NO-GO"), verdict(page)
    expect(cell(page, 22)).to_have_class(re.compile(r"\binvalid\b"))
    assert cell(page, 22).locator(".letter").inner_text() == "S"
    assert any("shared layer 22" in v and "full layer 19" in v for v in violations(page)), violations(page)
    assert focused_boundary(page) == ("3", "22")
    expect(page.locator("#split")).to_have_value("14,7,9,8,8,8,8,16")

    updated(page, lambda: page.keyboard.press("Shift+ArrowRight"))  # to the next full layer, 23
    expect(page).to_have_url(re.compile(r"split=14%2C8%2C8%2C8"))
    assert query(page)["split"] == "14,8,8,8,8,8,8,16"
    assert verdict(page).startswith("GO"), verdict(page)
    assert focused_boundary(page) == ("3", "23")
    assert page.locator("#layer-map .cell.invalid").count() == 0


def test_pointer_drag_moves_a_boundary(open_page):
    page = open_page("/")
    expect(boundary(page, 2)).to_have_attribute("aria-valuenow", "15")
    updated(page, lambda: drag_boundary(page, 2, 11))  # layer 11 is full
    expect(page).to_have_url(re.compile(r"split=10%2C12%2C"))
    assert query(page)["split"] == "10,12,8,8,8,8,8,16"
    assert verdict(page).startswith("GO"), verdict(page)
    expect(boundary(page, 2)).to_have_attribute("aria-valuenow", "11")

    updated(page, lambda: drag_boundary(page, 2, 13))  # layer 13 is shared
    assert query(page)["split"] == "12,10,8,8,8,8,8,16"
    assert verdict(page).startswith("NO-GO"), verdict(page)
    expect(cell(page, 13)).to_have_class(re.compile(r"\binvalid\b"))
    expect(boundary(page, 2)).to_have_class(re.compile(r"\binvalid\b"))
    assert any("shared layer 13" in v for v in violations(page)), violations(page)


def test_gpu_count_follows_tp(open_page):
    page = open_page("/")

    def set_tp():
        page.fill("#tp", "8")
        page.dispatch_event("#tp", "change")

    updated(page, set_tp)
    settle(page)
    expect(page.locator("#gpu-count")).to_have_text("TP 8 × CP 8 × PP 8 × DP 1 = 512 GPUs")
    assert query(page)["tp"] == "8", page.url


def test_share_url_round_trip(open_page):
    page = open_page("/")
    boundary(page, 5).focus()
    updated(page, lambda: page.keyboard.press("ArrowRight"))  # 39 -> 40 (shared): INVALID

    def set_cp():
        page.fill("#cp", "4")
        page.dispatch_event("#cp", "change")

    updated(page, set_cp)
    settle(page)
    assert query(page)["cp"] == "4" and query(page)["split"] == "14,8,8,9,7,8,8,16", page.url
    assert verdict(page).startswith("NO-GO")

    copy = open_page(urlsplit(page.url).path + "?" + urlsplit(page.url).query)
    assert verdict(copy) == verdict(page)
    assert copy.locator("#gpu-count").inner_text() == page.locator("#gpu-count").inner_text()
    assert copy.locator("#gpu-count").inner_text() == "TP 4 × CP 4 × PP 8 × DP 1 = 128 GPUs"
    assert boundaries(copy) == boundaries(page)
    assert form_values(copy) == form_values(page)
    assert violations(copy) == violations(page)


def test_bad_url_values_are_field_messages(open_page):
    page = open_page("/?pp=abc&tp=0&split=1,x&mode=split", figures=False)
    for name, needle in (("pp", "abc"), ("tp", "0"), ("split", "x")):
        err = page.locator(f"#err-{name}")
        expect(err).to_be_visible()
        text = err.inner_text()
        assert name in text and needle in text, (name, text)
    assert "whole number" in page.locator("#err-pp").inner_text()
    assert "between 1 and 1,024" in page.locator("#err-tp").inner_text()
    assert verdict(page).startswith("NO-GO")
    fixes = page.locator("#blocking li.kind-input a[data-focus]").evaluate_all("els => els.map(a => a.dataset.focus)")
    assert set(fixes) >= {"pp", "tp", "split"}, fixes
    expect(page.locator("#err-first")).to_be_hidden()  # empty messages take no space


def test_receipt_download_and_verify(open_page, server):
    page = open_page("/")
    boundary(page, 3).focus()
    updated(page, lambda: page.keyboard.press("ArrowLeft"))  # the receipt follows the live plan
    with page.expect_download() as info:
        page.click("#receipt-link")
    download = info.value
    assert download.suggested_filename == "isplan-receipt.json"
    receipt = json.loads(Path(download.path()).read_text())
    training = next(lay for lay in receipt["layouts"] if lay["name"] == "training")
    assert training["stage_sizes"] == [14, 7, 9, 8, 8, 8, 8, 16]
    assert training["valid"] is False

    def verify(body: dict) -> dict:
        resp = page.request.post(server.url + "/api/v1/verify", data=json.dumps(body),
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 200, resp.text()
        return resp.json()

    ok = verify(receipt)
    assert ok["ok"] is True, ok

    training["stages"][1]["first_layer"] = 16
    bad = verify(receipt)
    assert bad["ok"] is False
    assert any("stage 2" in d and "first_layer" in d for d in bad["differences"]), bad["differences"]


def test_upload_a_config(open_page, server, tmp_path):
    cfg = json.loads(PRESET.read_text())
    cfg["indexer_types"][14] = "shared"  # layer 15, where stage 2 of first 14 / last 16 starts
    path = tmp_path / "glm-5.2-shared15.json"
    path.write_text(json.dumps(cfg, indent=2))

    page = open_page("/?engine=hf&pp=8&first=14&last=16")  # hf reads the config's indexer_types
    page.set_input_files("#config-file", str(path))
    with page.expect_navigation():
        page.get_by_role("button", name="Load config").click()
    wait_for_figures(page)
    model = query(page)["model"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", model), page.url
    assert hashlib.sha256(path.read_bytes()).hexdigest() == model.removeprefix("sha256:")
    assert page.locator("#model").input_value() == model
    assert page.locator("#model option:checked").inner_text().startswith("uploaded: sha256:")
    # an upload opens a plan that runs on it (the engine's profile on the page's GPU), not a surprise NO-GO
    assert query(page)["engine"] == "hf" and verdict(page).startswith("GO"), (page.url, verdict(page))
    assert model.removeprefix("sha256:")[:16] in page.locator("#summary .meta").first.inner_text()
    # the CLI line reads the config from the file the page offers, byte for byte
    name = f"config-{model.removeprefix('sha256:')[:12]}.json"
    assert page.locator("#export-cli").inner_text().startswith(f"isplan check {name} ")
    href = page.locator("#config-download").get_attribute("href")
    assert page.request.get(server.url + href).body() == path.read_bytes()

    # the first 14 / last 16 split on this config starts stage 2 on its shared layer 15
    rel = f"/?model={quote(model)}&engine=hf&pp=8&first=14&last=16"
    again = open_page(rel)
    assert verdict(again).startswith("NO-GO"), verdict(again)
    expect(cell(again, 15)).to_have_class(re.compile(r"\binvalid\b"))
    assert cell(again, 15).locator(".letter").inner_text() == "S"
    assert any(v.startswith("stage 2 ") and "shared layer 15" in v for v in violations(again)), violations(again)

    # the upload survives a restart: a second server on the same data directory reads it from SQLite
    with AppServer(server.data_dir, log_path=tmp_path / "second.log") as second:
        fresh = open_page(rel, base=second.url)
        assert verdict(fresh) == verdict(again) and boundaries(fresh) == boundaries(again)
        assert fresh.locator("#model").input_value() == model
        assert not fresh.locator("#err-model").inner_text()


@pytest.mark.parametrize("button, action", [("Balance (optimal valid layout)", "balance"),
                                            ("Nearest valid", "nearest")])
def test_balance_and_nearest_valid(open_page, button, action):
    start = "10,10,10,10,10,10,9,9"
    page = open_page(f"/?split={quote(start)}&{PROFILE_PARALLEL}")
    assert verdict(page).startswith("NO-GO"), verdict(page)
    updated(page, lambda: page.get_by_role("button", name=button, exact=True).click())
    assert verdict(page).startswith("GO"), (action, verdict(page), violations(page))
    q = query(page)
    assert q["split"] != start and "layout" not in q, page.url
    sizes = [int(x) for x in q["split"].split(",")]
    assert len(sizes) == 8 and sum(sizes) == 78
    expect(page.locator("#split")).to_have_value(q["split"])
    starts = [1 + sum(sizes[:i]) for i in range(8)]
    assert all(s in GLM52_FULL for s in starts), starts
    assert [b[1] for b in boundaries(page)] == starts[1:]
    assert "action" not in q

    # the next edit keeps the new layout (the form must have picked it up)
    def set_tp():
        page.fill("#tp", "2")
        page.dispatch_event("#tp", "change")

    updated(page, set_tp)
    settle(page)
    assert query(page)["tp"] == "2" and query(page)["split"] == q["split"], page.url
    assert page.locator("#boundary-line").inner_text().startswith("Boundary: every stage starts on a full")
    assert page.locator("#layer-map .cell.invalid").count() == 0


def test_hostile_strings_are_inert(open_page):
    page = open_page("/?model=" + quote(HOSTILE))
    err = page.locator("#err-model")
    expect(err).to_be_visible()
    assert HOSTILE in err.inner_text(), err.inner_text()
    assert page.locator("img[src=x]").count() == 0
    assert "showing glm-5.2" in err.inner_text()  # an unknown model shows the default, said beside the field
    page.wait_for_timeout(200)  # an injected onerror would have fired by now (the fixture fails on dialogs)
    assert page.watch.dialogs == []


def test_hostile_upload_is_inert(open_page):
    """A hostile file name and model_type come back in the refusal message, as text."""
    cfg = json.loads(PRESET.read_text())
    cfg["model_type"] = HOSTILE
    del cfg["kv_lora_rank"]
    page = open_page("/")
    page.set_input_files("#config-file", files=[{"name": HOSTILE + ".json", "mimeType": "application/json",
                                                 "buffer": json.dumps(cfg).encode()}])
    url_before = page.url
    page.get_by_role("button", name="Load config").click()
    expect(page.locator("#err-upload")).to_contain_text("refused")  # shown in place, no raw page
    assert page.url == url_before
    text = page.locator("#err-upload").inner_text()
    assert f"upload '{HOSTILE}.json' refused" in text and f"model_type '{HOSTILE}'" in text, text
    assert page.locator("img[src=x]").count() == 0
    page.wait_for_timeout(200)
    assert page.watch.dialogs == []
    # Chromium logs the refused request (a 422) as a console error: expected here, nothing else is
    expected = [e for e in page.watch.console_errors if "status of 422" in e]
    assert len(expected) <= 1 and len(expected) == len(page.watch.console_errors), page.watch.console_errors
    page.watch.console_errors.clear()
