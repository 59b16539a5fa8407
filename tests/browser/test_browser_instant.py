"""The page as one answer (issue 8) and an instant page (issue 12), in Debian's Chromium.

* Every kind of change (Balance, Nearest valid, typing then an immediate click, drag, key moves)
  ends with a URL that, opened in a fresh browser, draws the same verdict and stage table.
* Moves are drawn before the server answers: ten key presses move ten layers; a drag shows the
  boundary, coloured, while the button is still down; edits made while a request is in flight
  are not lost.
* Back undoes a discrete change; the compare view survives its share URL; copy buttons say when
  the clipboard refused.
* axe-core (vendored under tests/vendor/, injected by Playwright, never served) finds nothing
  serious or critical in the valid, invalid, error and compare states; at 390 px the verdict,
  GPU equation and layer map come first and nothing scrolls sideways.

Expected layouts are derived here from GLM-5.2's full layers (``GLM52_FULL``, the indexer rule
checked in tests/core/model/test_layer_roles.py), never read back from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import quote, urlsplit

import pytest
from browser_support import ALL_FIGURES_DRAWN_JS, REPO, launch_profile, wait_for_figures
from dashboard import (
    GLM52_FULL,
    PROFILE_PARALLEL,
    boundaries,
    boundary,
    cell,
    query,
)
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]  # Chromium and a live server: run on its own


AXE = REPO / "tests" / "vendor" / "axe-core-4.14.1.min.js"
# the trainer line a launcher runs its flags with (an import needs to see what would run)
TRAIN = 'torchrun pretrain_gpt.py "${MODEL_ARGS[@]}" "${PERF_ARGS[@]}"\n'
N_LAYERS = 78
# every request the page sends leaves 300 ms late (htmx sends through XMLHttpRequest)
SLOW_REQUESTS = """() => { const send = XMLHttpRequest.prototype.send;
    XMLHttpRequest.prototype.send = function (body) { setTimeout(() => send.call(this, body), 300); }; }"""


def starts_of(sizes: list[int]) -> list[int]:
    return [1 + sum(sizes[:i]) for i in range(len(sizes))]


def settle(page: Page) -> None:
    """Wait until the queue is empty and nothing is in flight, twice 100 ms apart."""
    for _ in range(2):
        page.wait_for_function("() => window.__isplanIdle && window.__isplanIdle()")
        page.wait_for_timeout(100)
    page.wait_for_function("() => window.__isplanIdle()")


def screen(page: Page) -> dict[str, object]:
    """What a reload must reproduce: the verdict with its reasons, the boundary line, the stage
    table and the boundaries."""
    return {
        "verdict": page.locator("#verdict").inner_text(),
        "blocking": page.locator("#blocking li").all_inner_texts(),
        "boundary": page.locator("#boundary-line").inner_text(),
        "table": page.locator("#stage-table tbody").inner_text(),
        "boundaries": boundaries(page),
    }


@pytest.fixture(scope="module")
def fresh_browser(browser, tmp_path_factory):
    """A second Chromium with its own profile: a share URL opened there knows nothing of the first."""
    ctx = launch_profile(browser.isplan_playwright, tmp_path_factory.mktemp("chromium-fresh"))
    try:
        yield ctx
    finally:
        ctx.close()


def reload_matches(page: Page, fresh_browser, server) -> dict[str, object]:
    settle(page)
    shown = screen(page)
    other = fresh_browser.new_page()
    try:
        rel = urlsplit(page.url)
        resp = other.goto(server.url + rel.path + "?" + rel.query)
        assert resp is not None and resp.status == 200
        wait_for_figures(other)
        assert screen(other) == shown, page.url
    finally:
        other.close()
    return shown


# --------------------------------------------------------------------------- issue 8: the URL is the screen

INVALID = [10, 10, 10, 10, 10, 10, 9, 9]  # stage 2 starts at 11 (full), stage 3 at 21 (shared) ...


@pytest.mark.parametrize("button", ["act-balance", "act-nearest"])
def test_action_then_reload(open_page, fresh_browser, server, button):
    page = open_page(f"/?split={quote(','.join(map(str, INVALID)))}&{PROFILE_PARALLEL}")
    page.click(f"#{button}")
    shown = reload_matches(page, fresh_browser, server)
    sizes = [int(x) for x in query(page)["split"].split(",")]
    assert sum(sizes) == N_LAYERS and all(s in GLM52_FULL for s in starts_of(sizes)), sizes
    assert shown["verdict"].startswith("GO"), shown
    assert page.evaluate("() => document.activeElement.id") == button  # focus stays on the control that acted


def test_typing_then_immediate_click(open_page, fresh_browser, server):
    """Type a split and click Balance before the typing's own update leaves: the last action wins."""
    page = open_page("/?" + PROFILE_PARALLEL + "&pp=8&first=14&last=16")
    page.fill("#split", ",".join(map(str, INVALID)))
    page.click("#act-balance")
    reload_matches(page, fresh_browser, server)
    sizes = [int(x) for x in query(page)["split"].split(",")]
    assert sizes != INVALID and all(s in GLM52_FULL for s in starts_of(sizes)), sizes
    assert page.locator("#split").input_value() == query(page)["split"]


def test_typing_fast_loses_nothing(open_page, fresh_browser, server):
    """Keystrokes while a request is in flight end in the state typed last."""
    page = open_page("/")
    page.locator("#tp").fill("")
    page.locator("#tp").press_sequentially("8", delay=0)
    page.locator("#cp").fill("4")
    page.locator("#dp").fill("2")
    shown = reload_matches(page, fresh_browser, server)
    q = query(page)
    assert (q["tp"], q["cp"], q["dp"]) == ("8", "4", "2"), page.url
    # TP 8 x CP 4 x PP 8 x DP 2, by hand
    assert page.locator("#gpu-count").inner_text().endswith("= 512 GPUs"), shown


def test_drag_then_reload(open_page, fresh_browser, server):
    page = open_page("/")
    b, c = boundary(page, 2).bounding_box(), cell(page, 11).bounding_box()
    page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)
    page.mouse.down()
    page.mouse.move(c["x"] + c["width"] / 2, c["y"] + c["height"] / 2, steps=8)
    # drawn during the drag, before the button is released: at layer 11, which is full
    expect(boundary(page, 2)).to_have_attribute("aria-valuenow", "11")
    assert page.evaluate("""() => { const b = document.querySelector('.boundary[data-stage="2"]');
        return b.nextElementSibling.dataset.layer; }""") == "11"
    assert "invalid" not in (boundary(page, 2).get_attribute("class") or "")
    c13 = cell(page, 13).bounding_box()
    page.mouse.move(c13["x"] + c13["width"] / 2, c13["y"] + c13["height"] / 2, steps=3)
    expect(boundary(page, 2)).to_have_attribute("aria-valuenow", "13")
    expect(boundary(page, 2)).to_have_class(re.compile(r"\binvalid\b"))  # 13 is shared
    expect(cell(page, 13)).to_have_class(re.compile(r"\binvalid\b"))
    page.mouse.up()
    shown = reload_matches(page, fresh_browser, server)
    assert query(page)["split"] == "12,10,8,8,8,8,8,16"
    assert shown["verdict"].startswith("NO-GO")


def test_slow_answers_during_a_drag_lose_nothing(open_page, fresh_browser, server):
    """With every answer 300 ms late, an answer to an earlier drag position lands while the drag
    goes on; the drop still ends on the last position."""
    page = open_page("/")
    page.evaluate(SLOW_REQUESTS)
    b = boundary(page, 2).bounding_box()
    page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)
    page.mouse.down()
    for layer, wait in ((11, 250), (7, 700)):  # the answer for 11 arrives while the pointer is on 7
        c = cell(page, layer).bounding_box()
        page.mouse.move(c["x"] + c["width"] / 2, c["y"] + c["height"] / 2, steps=4)
        page.wait_for_timeout(wait)
    page.mouse.up()
    reload_matches(page, fresh_browser, server)
    assert query(page)["split"] == "6,16,8,8,8,8,8,16", page.url  # stage 2 starts at layer 7


def test_typing_while_balance_is_in_flight_keeps_both(open_page, fresh_browser, server):
    """Balance's answer arrives after the user typed in another field: the form takes the balanced
    split, keeps what was typed, and the last request carries both."""
    page = open_page(f"/?split={quote(','.join(map(str, INVALID)))}&{PROFILE_PARALLEL}")
    page.evaluate(SLOW_REQUESTS)
    page.click("#act-balance")
    page.fill("#gpu_memory_gb", "96")
    page.select_option("#gpu", "custom")
    reload_matches(page, fresh_browser, server)
    q = query(page)
    sizes = [int(x) for x in q["split"].split(",")]
    assert sizes != INVALID and all(s in GLM52_FULL for s in starts_of(sizes)), q
    assert (q["gpu"], q["gpu_memory_gb"]) == ("custom", "96"), q


@pytest.mark.parametrize("move", ["moveBefore", "insertBefore"])
def test_ten_key_presses_move_ten_layers(open_page, fresh_browser, server, move):
    """Each press moves the focused boundary one layer at once, and focus stays on it: with the
    DOM's state-preserving ``moveBefore`` (Chromium 133+) and with ``insertBefore``, which drops the
    focus the page then gives back (browsers without ``moveBefore``)."""
    page = open_page("/")
    if move == "insertBefore":
        page.evaluate("() => { delete Element.prototype.moveBefore; }")
    b = boundary(page, 2)  # starts at 15; stage 1 keeps at least layer 1
    b.focus()
    for _ in range(10):
        page.keyboard.press("ArrowLeft", delay=0)
    # drawn at once, before any answer: the presses add up
    assert page.evaluate("""() => document.querySelector('.boundary[data-stage="2"]').getAttribute('aria-valuenow')""") == "5"
    shown = reload_matches(page, fresh_browser, server)
    assert query(page)["split"] == "4,18,8,8,8,8,8,16"
    assert shown["boundaries"][0] == ("2", 5)
    assert page.evaluate("() => document.activeElement.dataset.stage") == "2"
    # each slider's range is the layers its stage may start at: after the previous start, before the next
    ranges = page.evaluate("""() => Array.from(document.querySelectorAll('#layer-map .boundary'))
        .map(b => [Number(b.getAttribute('aria-valuemin')), Number(b.getAttribute('aria-valuemax'))])""")
    starts = [1, 5, 23, 31, 39, 47, 55, 63]  # stage 2 moved from 15 to 5
    assert ranges == [[starts[k - 1] + 1, (starts[k + 1] - 1) if k + 1 < 8 else N_LAYERS] for k in range(1, 8)], ranges
    perf = page.evaluate("() => window.__isplanPerf")
    assert len(perf["drawn"]) == 10 and perf["sent"] < 10, perf  # every press drawn, the requests coalesced


def test_an_answer_replaces_only_what_changed(open_page):
    page = open_page("/")
    page.evaluate("""() => { const rows = document.querySelectorAll('#stage-table tbody tr');
        rows[0].__kept = 1; rows[3].__kept = 1; document.getElementById('act-balance').__kept = 1;
        document.getElementById('fig-memory') && (document.getElementById('fig-memory').__kept = 1); }""")
    boundary(page, 4).focus()
    page.keyboard.press("ArrowRight")  # stage 3 grows by one layer, stage 4 shrinks: rows 3 and 4 change
    settle(page)
    kept = page.evaluate("""() => { const rows = document.querySelectorAll('#stage-table tbody tr');
        return [rows[0].__kept === 1, rows[3].__kept === 1, rows[3].innerText.includes('32–38'),
                document.getElementById('act-balance').__kept === 1]; }""")
    assert kept == [True, True, True, True], kept  # same nodes, new text where it changed


def test_figures_wait_until_they_are_seen(open_page):
    """Plotly loads when a figure first scrolls into view; a figure off screen during a move is
    redrawn (Plotly.react) with the new plan once it is scrolled to."""
    page = open_page("/")
    page.set_viewport_size({"width": 1440, "height": 600})
    page.goto(page.url)
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    page.wait_for_timeout(300)
    assert page.evaluate("() => typeof window.Plotly") == "undefined"
    fig = page.locator("#fig-compute")
    before = json.loads(fig.get_attribute("data-figure"))["data"][0]["y"][0]  # stage 1: layers 1-14
    boundary(page, 2).focus()
    page.keyboard.press("ArrowLeft")
    settle(page)
    fig.scroll_into_view_if_needed()
    page.wait_for_function("""() => { const f = document.getElementById('fig-compute');
        return f.querySelector('.main-svg') && f.dataset.drawn === f.dataset.figure; }""")
    caption = page.locator("#fig-compute").locator("xpath=following-sibling::figcaption").inner_text()
    imbalance = page.evaluate("""() => { const y = document.getElementById('fig-compute').data[0].y;
        return Math.max(...y) / (y.reduce((a, b) => a + b, 0) / y.length); }""")
    assert f"imbalance {imbalance:.2f}×" in caption, caption  # the caption follows the figure it describes
    # stage 1 now holds layers 1-13: one layer less, so its drawn bar is lower than before
    first_bar = page.evaluate("() => document.getElementById('fig-compute').data[0].y[0]")
    assert first_bar < before, (first_bar, before)


def test_back_undoes_a_discrete_change(open_page):
    start = ",".join(map(str, INVALID))
    page = open_page(f"/?split={quote(start)}&{PROFILE_PARALLEL}")
    before = screen(page)
    page.click("#act-balance")
    settle(page)
    balanced = query(page)["split"]
    assert balanced != start
    page.go_back()
    page.wait_for_function("s => new URLSearchParams(location.search).get('split') === s", arg=start)
    settle(page)
    assert screen(page) == before
    assert page.locator("#split").input_value() == start
    page.go_forward()
    page.wait_for_function("s => new URLSearchParams(location.search).get('split') === s", arg=balanced)
    settle(page)
    assert page.locator("#split").input_value() == balanced


def test_a_key_burst_is_one_history_entry(open_page):
    page = open_page("/")
    first = page.url
    boundary(page, 4).focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight", delay=0)
    settle(page)
    assert query(page)["split"] == "14,8,11,5,8,8,8,16"  # stage 4 starts at 31 + 3 = 34
    page.go_back()
    page.wait_for_function("u => location.href === u", arg=first)
    settle(page)
    assert boundaries(page)[2] == ("4", 31) and "split" not in query(page)


# --------------------------------------------------------------------------- compare, search, copy


def test_compare_round_trip(open_page, fresh_browser, server):
    page = open_page("/")
    page.click("#compare-pin")
    settle(page)
    assert page.evaluate("() => document.activeElement.id") == "compare-clear"  # the button that replaced it
    boundary(page, 3).focus()
    page.keyboard.press("ArrowLeft")  # B: stage 3 starts at shared layer 22
    settle(page)
    q = query(page)
    assert "a" in q and q["split"] == "14,7,9,8,8,8,8,16", page.url
    table = page.locator("#compare-table").inner_text()
    assert "GO" in table and "NO-GO" in table
    diff = page.locator("#compare-diff").inner_text()
    assert "--split" in diff and "14,7,9,8,8,8,8,16" in diff, diff
    other = fresh_browser.new_page()
    try:
        rel = urlsplit(page.url)
        other.goto(server.url + rel.path + "?" + rel.query)
        assert other.locator("#compare-table").inner_text() == table
        assert other.locator("#compare-diff").inner_text() == diff
    finally:
        other.close()
    page.click("#compare-clear")
    settle(page)
    assert "a" not in query(page) and page.locator("#compare").count() == 0


def test_gpu_budget_search_loads_a_plan(open_page):
    page = open_page("/")
    page.fill("#search-gpus", "256")
    page.click("#start .search button[type=submit]")
    first = page.locator("#search-results a.load-plan").first
    expect(first).to_be_visible(timeout=30_000)
    rows = page.locator("#search-results tbody tr")
    assert rows.count() >= 1
    # every ranked row multiplies out to the budget (TP x CP x PP x DP, read from the row itself)
    for text in rows.locator("td:nth-child(2)").all_inner_texts():
        tp, cp, pp, dp = (int(x) for x in text.split("×"))
        assert tp * cp * pp * dp == 256, text
    assert axe_findings(page) == []  # the ranked table is as accessible as the page
    with page.expect_navigation():
        first.click()
    wait_for_figures(page)
    assert query(page)["gpus"] == "256"
    assert page.locator("#search-results").inner_text() == ""  # a new page: the list is gone
    assert page.locator("#gpu-count").inner_text().endswith("= 256 GPUs")


def test_search_without_budget_is_an_error_in_place(open_page):
    page = open_page("/")
    url = page.url
    page.evaluate("() => document.getElementById('search-gpus').removeAttribute('required')")
    page.click("#start .search button[type=submit]")
    expect(page.locator("#search-results .field-error")).to_contain_text("give a GPU budget")
    assert page.url == url


def test_launcher_paste(open_page):
    """A refused launcher is a message beside the box (the page stays); an accepted one draws the plan
    it describes (htmx swaps the page in and pushes its URL), with the engine the script is written
    for and every value's file:line beside the verdict."""
    page = open_page("/")
    url = page.url
    page.click("#start .launcher button[type=submit]")
    expect(page.locator("#err-launcher")).to_contain_text("paste a launcher script")
    page.fill("#launcher", "PERF_ARGS=( --pipeline-model-parallel-size banana )\n" + TRAIN)
    page.click("#start .launcher button[type=submit]")
    expect(page.locator("#err-launcher")).to_contain_text("banana")
    assert page.url == url
    page.watch.console_errors = [e for e in page.watch.console_errors if "status of 422" not in e]
    page.fill("#launcher", "PERF_ARGS=(\n  --pipeline-model-parallel-size 6\n  --tensor-model-parallel-size 2\n)\n" + TRAIN)
    page.click("#start .launcher button[type=submit]")
    page.wait_for_function("() => new URLSearchParams(location.search).get('pp') === '6'")
    wait_for_figures(page)
    q = query(page)
    assert (q["pp"], q["tp"], q.get("engine", "megatron")) == ("6", "2", "megatron"), page.url  # pretrain_gpt.py: Megatron
    assert [b[1] for b in boundaries(page)] == [14, 27, 40, 53, 66]  # 78 layers in 6 stages of 13
    report = page.locator("#launcher-report")
    assert "megatron" in report.locator("summary").inner_text()
    rows = dict(zip(report.locator("tbody th").all_inner_texts(), report.locator("tbody td:nth-child(3)").all_inner_texts()))
    assert rows["--pipeline-model-parallel-size"].endswith(":2") and rows["--tensor-model-parallel-size"].endswith(":3"), rows


def test_launcher_with_its_sourced_files(open_page, tmp_path):
    """The script and the files it sources, chosen together and posted as they are: the server reads
    them as bash would; a sourced file not chosen is named in the refusal (fail closed)."""
    (tmp_path / "models.sh").write_text("MODEL_ARGS=(\n  --pipeline-model-parallel-size 6\n)\n")
    (tmp_path / "cluster.env").write_text("export MASTER_PORT=29500\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash\nsource ./models.sh\n. /etc/cluster.env\n"
                                     "PERF_ARGS=( --tensor-model-parallel-size 2 )\n" + TRAIN)
    page = open_page("/")
    page.set_input_files("#launcher-file", [str(tmp_path / "run.sh"), str(tmp_path / "models.sh")])
    page.click("#start .launcher button[type=submit]")
    expect(page.locator("#err-launcher")).to_contain_text("cluster.env")
    page.watch.console_errors = [e for e in page.watch.console_errors if "status of 422" not in e]
    page.set_input_files("#launcher-file", [str(tmp_path / n) for n in ("run.sh", "models.sh", "cluster.env")])
    page.click("#start .launcher button[type=submit]")
    page.wait_for_function("() => new URLSearchParams(location.search).get('pp') === '6'")
    wait_for_figures(page)
    q = query(page)
    assert (q["pp"], q["tp"]) == ("6", "2"), page.url
    where = page.locator("#launcher-values tbody tr", has_text="--pipeline-model-parallel-size").locator("td").nth(1)
    assert where.inner_text() == "models.sh:2"  # the value's file and line, as bash read it


def test_a_failed_update_says_so(open_page):
    """The server unreachable: the page says the update failed and keeps the last answered plan;
    the next change that gets through clears the message."""
    page = open_page("/")
    page.route("**/fragment?**", lambda route: route.abort())
    boundary(page, 3).focus()
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#status")).to_contain_text("Update failed")
    assert "split" not in query(page)  # the URL still holds the last plan the server drew
    page.unroute("**/fragment?**")
    page.watch.console_errors = [e for e in page.watch.console_errors  # the refused request, as htmx logs it
                                 if "ERR_FAILED" not in e and "htmx:sendError" not in e and "htmx:afterRequest" not in e]
    page.keyboard.press("ArrowLeft")
    settle(page)
    expect(page.locator("#status")).to_have_text("")
    assert query(page)["split"] == "14,6,10,8,8,8,8,16"  # both presses count: 23 - 2 = 21


def test_no_receipt_for_a_plan_with_bad_fields(open_page):
    """A receipt of a plan whose fields could not be read would be a raw JSON error: the page says
    what to fix instead of linking to it."""
    page = open_page("/?split=14,8,8,8,8,8,8,16&tp=0", figures=False)
    link = page.locator("#receipt-link")
    assert link.get_attribute("href") is None and link.get_attribute("aria-disabled") == "true"
    assert "fix the fields" in link.inner_text()


def test_copy_reports_failure_honestly(open_page):
    """The browser refuses the clipboard: the text is selected instead (Ctrl+C copies it) and the page
    says so; with the clipboard, the button says Copied and the clipboard has the export."""
    page = open_page("/")
    page.evaluate("""() => { Object.defineProperty(navigator, 'clipboard', {configurable: true,
        value: {writeText: () => Promise.reject(new Error('denied'))}}); }""")
    page.click("#copy-megatron")
    expect(page.locator("#copy-note")).to_contain_text("refused clipboard access")
    expect(page.locator("#copy-note")).to_contain_text("selected")
    selected = page.evaluate("() => window.getSelection().toString()")
    assert selected == page.locator("#export-megatron").inner_text() and "--pipeline-model-parallel-size" in selected
    page.evaluate("""() => { window.__copied = null; Object.defineProperty(navigator, 'clipboard', {configurable: true,
        value: {writeText: t => { window.__copied = t; return Promise.resolve(); }}}); }""")
    page.click("#copy-megatron")
    expect(page.locator("#copy-megatron")).to_have_text("Copied")
    assert "--pipeline-model-parallel-size" in page.evaluate("() => window.__copied")


# --------------------------------------------------------------------------- first load


def test_plotly_bundle_is_the_recorded_one():
    vendor = json.loads((REPO / "static" / "vendor" / "VENDOR.json").read_text())["plotly"]
    body = (REPO / "static" / "vendor" / vendor["file"]).read_bytes()
    assert hashlib.sha256(body).hexdigest() == vendor["sha256"]
    assert body.startswith(b"/**\n* plotly.js (basic - minified) v" + vendor["version"].encode())
    axe = json.loads((REPO / "tests" / "vendor" / "VENDOR.json").read_text())["axe-core"]
    assert hashlib.sha256(AXE.read_bytes()).hexdigest() == axe["sha256"]


def test_first_load_is_light(browser, server):
    """Bytes on the wire for a first visit (fresh cache), and no full Plotly bundle."""
    page = browser.new_page()
    sizes: dict[str, int] = {}
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    cdp.on("Network.loadingFinished", lambda e: sizes.__setitem__(e["requestId"], e["encodedDataLength"]))
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    try:
        page.goto(server.url + "/")
        wait_for_figures(page)
        for fig in page.locator(".plotly-figure").all():  # bring each figure into view: Plotly loads now
            fig.scroll_into_view_if_needed()
        page.wait_for_function(ALL_FIGURES_DRAWN_JS)
        page.wait_for_timeout(200)
        total = sum(sizes.values())
        assert total <= 1_000_000, (total, urls)
        assert not any("plotly.min.js" in u for u in urls), urls
        assert page.locator(".modebar").count() == 0  # no Plotly toolbar, no "share to cloud"
    finally:
        page.close()


def test_static_caching_and_compression(browser, server):
    page = browser.new_page()
    try:
        page.goto(server.url + "/")
        js = page.evaluate("() => document.querySelector('script[src*=\"app.js\"]').getAttribute('src')")
        assert "?v=" in js
        resp = page.request.get(server.url + js, headers={"Accept-Encoding": "gzip"})
        assert "immutable" in resp.headers["cache-control"]
        resp = page.request.get(server.url + "/", headers={"Accept-Encoding": "gzip"})
        assert resp.headers.get("content-encoding") == "gzip"
    finally:
        page.close()


# --------------------------------------------------------------------------- accessibility and phones


def axe_findings(page: Page) -> list[str]:
    page.evaluate(AXE.read_text())
    return page.evaluate("""async () => {
        const r = await axe.run(document, {resultTypes: ['violations']});
        return r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
          .map(v => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(' | ')}`);
    }""")


@pytest.mark.parametrize("state, path", [
    ("valid", "/"),
    ("invalid", "/?split=14,7,9,8,8,8,8,16&" + PROFILE_PARALLEL),
    ("error", "/?pp=abc&tp=0&split=1,x&mode=split"),
    ("compare", "/?split=14,7,9,8,8,8,8,16&a=" + quote("split=14,8,8,8,8,8,8,16&" + PROFILE_PARALLEL)),
    ("serving", "/?model=glm-5.2&engine=sglang&pp=8&tp=8"),
    ("maxtext", "/?model=glm-5.2&engine=maxtext&ici_pipeline_parallelism=4&layers_per_pipeline_stage=4"),
    ("vpp", "/?split=13,26,13,26&vpp=2&tp=4"),
    ("about", "/about"),
    ("slime-kimi-k2", "/?model=kimi-k2&engine=slime&pp=4&tp=8&ep=32&dp=2"),
    ("vllm", "/?model=glm-5.2&engine=vllm&tp=8&pp=4"),
    ("hf", "/?model=glm-5.2&engine=hf&pp=4"),
    ("time-gb200", "/?model=qwen3-235b-a22b&engine=megatron&pp=8&vpp=3&ep=32&dp=32&gpu=gb200-186gb&precision=mxfp8"
                   "&global_batch=8192"),
])
@pytest.mark.parametrize("width", [1440, 390])
def test_axe_serious_and_critical(open_page, state, path, width):
    """At a desktop's width and a phone's: on a phone the stage table (and the about page's
    tables) are cut and scroll sideways, and a region that scrolls must take the keyboard's focus
    (axe ``scrollable-region-focusable``; every page at 390 px failed it before)."""
    page = open_page(path, figures=False)
    if width != 1440:
        page.set_viewport_size({"width": width, "height": 844})
        page.reload()
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width, state  # nothing scrolls sideways
    if page.locator(".plotly-figure").count():  # axe sees the drawn figures too
        for fig in page.locator(".plotly-figure").all():
            fig.scroll_into_view_if_needed()
        page.wait_for_function(ALL_FIGURES_DRAWN_JS)
    assert axe_findings(page) == [], state


def test_phone_layout(open_page):
    page = open_page("/")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(200)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    page.reload()  # a phone opens the page at this width
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    assert not page.locator("#search-gpus").is_visible()  # the start bar is folded to its heading
    tops = page.evaluate("""() => ['#start', '#verdict', '#gpu-count', '#layer-map', '#controls']
        .map(s => document.querySelector(s).getBoundingClientRect().top + window.scrollY)""")
    assert tops == sorted(tops), tops
    assert tops[1] < 250, tops  # the verdict is on the first screen, under the folded start bar
    # a touch drag moves a boundary (pointer events with pointerType touch)
    boundary(page, 2).scroll_into_view_if_needed()
    b, c = boundary(page, 2).bounding_box(), cell(page, 11).bounding_box()
    page.evaluate("""([bx, by, cx, cy]) => {
        const b = document.querySelector('.boundary[data-stage="2"]');
        const ev = (type, x, y, t) => t.dispatchEvent(new PointerEvent(type, {bubbles: true, clientX: x, clientY: y,
            pointerType: 'touch', pointerId: 7, isPrimary: true}));
        ev('pointerdown', bx, by, b); ev('pointermove', cx, cy, b); ev('pointerup', cx, cy, b);
    }""", [b["x"] + b["width"] / 2, b["y"] + b["height"] / 2, c["x"] + c["width"] / 2, c["y"] + c["height"] / 2])
    settle(page)
    assert query(page)["split"] == "10,12,8,8,8,8,8,16"
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    page.click("header a.to-settings")  # the settings form, far below on a phone, is one tap from the top
    page.wait_for_timeout(200)
    top = page.evaluate("() => document.getElementById('controls').getBoundingClientRect().top")
    assert -1 < top < 200, top   # at the top of the screen: a jump to an anchor may land a fraction of a pixel past it
    page.evaluate("() => window.scrollTo(0, 0)")
    page.click('header a[href="#start"]')  # the header's link unfolds the start bar
    expect(page.locator("#search-gpus")).to_be_visible()


@pytest.mark.parametrize("width", [1440, 390])
def test_figures_fit_their_boxes(open_page, width):
    """Every figure is drawn at its box's height (a fixed figure height overflowed a phone's shorter
    boxes and cut the axis titles off) and no legend is cut to a scrolling box (the memory figure's
    nine terms got one: Plotly's legend scrollbar has a size then)."""
    page = open_page("/", figures=False)
    page.set_viewport_size({"width": width, "height": 900})
    page.reload()
    page.wait_for_function("() => document.body.dataset.ready === '1'")
    for fig in page.locator(".plotly-figure:not(.pending)").all():
        fig.scroll_into_view_if_needed()
    page.wait_for_function("""() => Array.from(document.querySelectorAll('.plotly-figure:not(.pending)'))
        .every(f => f.querySelector('.main-svg'))""")
    sizes = page.evaluate("""() => Array.from(document.querySelectorAll('.plotly-figure:not(.pending)')).map(f => [
        f.id, Math.round(f.getBoundingClientRect().height), Math.round(f.querySelector('.main-svg').getBoundingClientRect().height),
        Array.from(f.querySelectorAll('.legend rect.scrollbar')).map(r => Number(r.getAttribute('height') || 0))])""")
    assert {s[0] for s in sizes} >= {"fig-memory", "fig-compute", "fig-time", "fig-context"}, sizes
    for name, box, drawn, scrollbars in sizes:
        assert drawn == box, (name, box, drawn)
        assert not any(scrollbars), (name, scrollbars)


@pytest.mark.parametrize("path", [
    "/?split=14,7,9,8,8,8,8,16&a=" + quote("split=14,8,8,8,8,8,8,16&" + PROFILE_PARALLEL),
    "/?pp=abc&tp=0&split=1,x&mode=split",
])
def test_phone_compare_and_error_states_fit(open_page, path):
    page = open_page(path, figures=False)
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(200)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
