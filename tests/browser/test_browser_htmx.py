"""The page on htmx (issue 17) and its start actions (issue 16), in Debian's Chromium.

* htmx 2.0.11 and idiomorph are loaded from this server; an edit, a key move and a drag are answered
  by htmx swaps of ``#results`` (no ``fetch`` of our own), focus and an opened ``<details>`` survive.
* The clipboard falls back to selecting the text on a plain-HTTP hostname (a non-secure origin:
  ``--host-resolver-rules`` maps ``isplan.test`` to 127.0.0.1) and says so.
* Tab reaches the settings before the results and the Copy buttons; the layer map's cells are reached
  by Tab and read with the arrow keys.
* Every preset, and an uploaded Llama-style config, opens a GO plan through the page's own controls;
  MaxText and serving pages start, and answer an edit, without a script error.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from browser_support import REPO, PageWatch, launch_profile, wait_for_figures
from dashboard import (
    boundary,
    drag_boundary,
    query,
    verdict,
)
from playwright.sync_api import Page, expect

from app.core.model.config import preset_ids

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]  # Chromium and a live server: run on its own


#: counts htmx's swaps of #results and any fetch() the page would make of its own
WATCH_SWAPS = """() => { window.__swaps = 0; window.__fetches = 0;
    document.addEventListener('htmx:afterSwap', e => { if (e.target.id === 'results') window.__swaps++; });
    const f = window.fetch.bind(window); window.fetch = (...a) => { window.__fetches++; return f(...a); }; }"""


def settle(page: Page) -> None:
    for _ in range(2):
        page.wait_for_function("() => window.__isplanIdle && window.__isplanIdle()")
        page.wait_for_timeout(100)


def test_htmx_drives_edits_keys_and_drags(open_page):
    page = open_page("/")
    assert page.evaluate("() => [window.htmx && htmx.version, typeof Idiomorph]") == ["2.0.11", "object"]
    page.evaluate(WATCH_SWAPS)
    page.fill("#cp", "4")
    settle(page)
    assert query(page)["cp"] == "4" and page.evaluate("() => window.__swaps") >= 1
    swaps = page.evaluate("() => window.__swaps")
    boundary(page, 3).focus()
    page.keyboard.press("ArrowLeft")
    settle(page)
    assert query(page)["split"] == "14,7,9,8,8,8,8,16" and page.evaluate("() => window.__swaps") > swaps
    swaps = page.evaluate("() => window.__swaps")
    drag_boundary(page, 2, 11)
    settle(page)
    assert query(page)["split"] == "10,11,9,8,8,8,8,16" and page.evaluate("() => window.__swaps") > swaps
    assert page.evaluate("() => window.__fetches") == 0  # every request was htmx's


def test_focus_and_open_details_survive_a_swap(open_page):
    page = open_page("/")
    page.evaluate("""() => { for (const id of ['memory-terms', 'parallel-checks', 'time-limits']) {
        const d = document.getElementById(id); d.open = true; d.__kept = 1; }
        document.getElementById('stage-table').__kept = 1; }""")
    page.locator("#dp").select_text()
    page.keyboard.type("2")
    settle(page)
    assert query(page)["dp"] == "2"
    assert page.evaluate("() => document.activeElement.id") == "dp"
    kept = page.evaluate("""() => ['memory-terms', 'parallel-checks', 'time-limits', 'stage-table']
        .map(id => { const e = document.getElementById(id); return [e.__kept === 1, e.open !== false]; })""")
    assert kept == [[True, True]] * 4, kept  # the same nodes (morphed, not replaced), still open
    assert page.locator("#gpu-count").inner_text().endswith("= 512 GPUs")  # TP 4 x CP 8 x PP 8 x DP 2


def test_copy_on_a_plain_http_hostname_selects_the_text(browser, server, tmp_path):
    ctx = launch_profile(browser.isplan_playwright, tmp_path / "profile",
                         args=("--host-resolver-rules=MAP isplan.test 127.0.0.1",))
    try:
        page = ctx.new_page()
        watch = PageWatch(page, "isplan.test")
        page.goto(f"http://isplan.test:{server.port}/")
        wait_for_figures(page)
        assert page.evaluate("() => window.isSecureContext") is False
        page.click("#copy-cli")
        expect(page.locator("#copy-note")).to_contain_text("not on a secure origin")
        expect(page.locator("#copy-note")).to_contain_text("selected")
        assert page.evaluate("() => window.getSelection().toString()") == page.locator("#export-cli").inner_text()
        page.click("#copy-url")
        assert page.evaluate("() => window.getSelection().toString()") == page.url  # the share URL, selected
        # Chromium says it ignores the Cross-Origin-Opener-Policy header on a non-secure origin: that
        # warning is the browser's, about the origin; nothing else may be reported
        assert [p for p in watch.problems() if "Cross-Origin-Opener-Policy" not in p] == []
    finally:
        ctx.close()


def test_tab_reaches_the_settings_before_the_results(open_page):
    page = open_page("/")
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); }")
    order = []
    for _ in range(400):
        page.keyboard.press("Tab")
        el = page.evaluate("""() => { const e = document.activeElement;
            return [e.id, e.closest('form') ? e.closest('form').id : '', e.closest('#results') ? 1 : 0, e.className]; }""")
        order.append(el)
        if el[0].startswith("copy-"):
            break
    ids = [e[0] for e in order]
    first_setting = next(i for i, e in enumerate(order) if e[1] in ("pick", "controls"))
    first_result = next(i for i, e in enumerate(order) if e[2])
    first_copy = next(i for i, e in enumerate(order) if e[0].startswith("copy-"))
    assert first_setting < first_result < first_copy, ids
    # the layer map: one tab stop for its cells, read with the arrow keys; its boundaries are sliders
    cells = [i for i, e in enumerate(order) if "cell" in e[3].split()]
    assert len(cells) == 1, ids
    page.locator("#L1").focus()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => document.activeElement.id") == "L2"
    assert "reuses top-k" not in page.locator("#L2").get_attribute("title")  # layer 2 is full
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => document.activeElement.id") == "L4"
    assert "reuses top-k of full layer 3" in page.locator("#L4").get_attribute("title")


@pytest.mark.parametrize("model", preset_ids())
def test_every_preset_loads_a_plan_that_runs(open_page, model):
    page = open_page("/?model=glm-5.2&engine=megatron&pp=8&first=14&last=16")
    page.select_option("#start-preset", model)
    with page.expect_navigation(timeout=60_000):
        page.click("#start form[action='/profile'] button[type=submit]")
    wait_for_figures(page)
    assert query(page)["model"] == model and verdict(page).startswith("GO"), (model, page.url, verdict(page))
    assert "memory" not in page.locator("#not-judged").all_inner_texts()  # the profile states its parallelism
    assert page.locator("#gpu-count").inner_text().startswith("TP ")


def test_an_uploaded_llama_config_loads_a_plan_that_runs(open_page, tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes((REPO / "app" / "core" / "presets" / "llama-3.1-70b.json").read_bytes())
    page = open_page("/")
    page.set_input_files("#config-file", str(path))
    with page.expect_navigation(timeout=60_000):
        page.get_by_role("button", name="Load config").click()
    wait_for_figures(page)
    assert query(page)["model"].startswith("sha256:") and verdict(page).startswith("GO"), (page.url, verdict(page))


def test_switching_the_engine_opens_its_plan_with_each_key_once(open_page):
    page = open_page("/")
    with page.expect_navigation(timeout=60_000):
        page.select_option("#engine", "vllm")
    wait_for_figures(page)
    keys = [k for k, _ in (p.split("=", 1) for p in urlsplit(page.url).query.split("&"))]
    assert len(keys) == len(set(keys)), page.url
    assert query(page)["engine"] == "vllm" and verdict(page).startswith("GO"), (page.url, verdict(page))
    assert page.locator("#cp").count() == 0 and page.locator("#export-serve").count() == 1


@pytest.mark.parametrize("path, field, value", [
    ("/?model=glm-5.2&engine=maxtext", "layers_per_pipeline_stage", "2"),
    ("/?model=qwen3-235b-a22b&engine=vllm&pp=2", "tp", "4"),
    ("/?model=glm-5.2&engine=sglang&pp=8", "tp", "8"),
])
def test_maxtext_and_serving_pages_start_and_answer(open_page, path, field, value):
    page = open_page(path)  # the fixture fails the test on any console or page error
    page.fill(f"#{field}", value)
    settle(page)
    assert query(page)[field] == value, page.url
    assert re.match(r"(NO-)?GO", verdict(page))
