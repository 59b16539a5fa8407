"""The page's server side without a browser: the GPU budget search fragment, the compare panel,
compression and caching of static files (the browser tests drive the same routes in Chromium).

Expected values come from hand arithmetic or a published formula stated beside each assertion,
or from a second route of the app (``/api/v1/check``) that is not the code under test.
"""

from __future__ import annotations

import hashlib
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode

import pytest

from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.core.plan import plan_from_query
from app.web.caching import IMMUTABLE, static_cache_control
from app.web.view import flag_diff

# full recompute needs a method and a layer count, DSA with CP the all-gather layout (Megatron-LM
# transformer_config.py:1913-1925, 3162-3177)
PROFILE = ("tp=4&cp=8&ep=32&etp=1&dp=1&sp=1&tpg=8192&recompute=full&rmethod=uniform&rnl=1&cp_comm_type=allgather"
           "&offload=1&d2h=1&pao=1")




def test_search_fragment_rows_multiply_to_the_budget_and_load_as_go(client):
    r = client.get("/fragment/search?model=glm-5.2&gpus=256")
    assert r.status_code == 200
    rows = re.findall(r"<td>(\d+) × (\d+) × (\d+) × (\d+)</td>", r.text)
    links = [unescape(h) for h in re.findall(r'class="load-plan button" href="/\?([^"]+)"', r.text)]
    assert rows and len(rows) == len(links)
    for (tp, cp, pp, dp), query in zip(rows, links, strict=True):
        assert int(tp) * int(cp) * int(pp) * int(dp) == 256
        params = dict(parse_qsl(query))
        assert (params.get("tp", "1"), params.get("cp", "1"), params["dp"], params["gpus"]) == (tp, cp, dp, "256")
        # one click loads a plan the whole app calls GO (the CLI's twin route, not the page)
        check = client.get("/api/v1/check?" + query).json()
        assert check["verdict"]["go"] is True, (query, check["verdict"])


@pytest.mark.parametrize("query, words", [("model=glm-5.2", "give a GPU budget"),
                                          ("model=glm-5.2&gpus=7", "no configuration of 7 GPUs"),
                                          ("model=glm-5.2&gpus=abc", "whole number")])
def test_search_fragment_errors_are_in_the_block(client, query, words):
    r = client.get("/fragment/search?" + query)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert words in unescape(r.text) and "load-plan" not in r.text


def test_compare_panel(client):
    a, b = "split=14,8,8,8,8,8,8,16&" + PROFILE, "split=14,7,9,8,8,8,8,16&" + PROFILE
    r = client.get("/fragment?" + b + "&a=" + quote(a))
    text = unescape(r.text)
    cells = re.findall(r'<td class="(ok|bad)">(GO|NO-GO)', text)
    assert cells == [("ok", "GO"), ("bad", "NO-GO")]  # A valid; B starts stage 3 on shared layer 22
    diff = re.search(r'<table id="compare-diff">(.*?)</table>', text, re.S).group(1)
    assert re.findall(r"<code>([^<]+)</code></th><td>([^<]+)</td><td>([^<]+)</td>", diff) == [
        ("--split", "14,8,8,8,8,8,8,16", "14,7,9,8,8,8,8,16")]
    # the bubble beside each plan is its simulated one, as its /api/v1/time twin reports it
    bubble_row = re.search(r"pipeline bubble</th>(.*?)</tr>", text, re.S).group(1)
    timed = [client.get("/api/v1/time?" + q).json()["time"]["bubble_fraction"] for q in (a, b)]
    assert re.findall(r"<td>([^<]+)</td>", bubble_row) == [f"{x * 100:.1f}% (simulated)" for x in timed]
    # and the page splits B's: 1F1B fill and drain, Narayanan et al. 2021 (arXiv:2104.04473 section
    # 2.2.1): idle (p - 1)(tf + tb) in (m + p - 1)(tf + tb), so (p - 1) / (m + p - 1) with equal stages;
    # p = 8, m = 8 x PP = 64 micro-batches (the page's stated assumption): 7 / 71; B's stages are not
    # equal (14 layers and the embedding on the first), so the rest is waiting on slower stages
    assert f"{7 / 71:.1%} is its fill and drain" in text and "waiting on slower stages" in text
    assert timed[1] > 7 / 71
    # the URL the page shows holds A too, as given, so the share URL reproduces the compare screen
    shown = dict(parse_qsl(r.headers["hx-replace-url"].removeprefix("/?")))
    assert shown["a"] == a and shown["split"] == "14,7,9,8,8,8,8,16"
    assert client.get("/fragment?" + PROFILE).text.count('id="compare"') == 0


def test_flag_diff_names_cli_flags():
    a, _ = plan_from_query({}, empty=SLIME_GLM52_PROFILE)
    b, _ = plan_from_query({"tp": "8", "first": "14", "last": "16", "pp": "8", "cp": "8", "ep": "32", "etp": "1",
                            "dp": "1", "sp": "1", "tpg": "8192", "recompute": "full", "rmethod": "uniform", "rnl": "1",
                            "offload": "1", "d2h": "1",
                            "pao": "1", "engine": "slime", "conv_pp": "2", "conv_last": "40", "cp_comm_type": "allgather"})
    assert flag_diff(a, b) == [("--tp", "4", "8")]
    assert flag_diff(a, a) == []


def test_static_cache_control():
    assert static_cache_control("/static/vendor/plotly-basic-4.1.1.min.js", "") == IMMUTABLE
    assert static_cache_control("/static/vendor/swagger-ui/swagger-ui-bundle.js", "") == "no-cache"
    assert static_cache_control("/static/app.js", "v=0123abcd") == IMMUTABLE
    assert static_cache_control("/static/app.js", "") == "no-cache"
    assert static_cache_control("/static/vendor/swagger-ui/swagger-ui.css", "") == "no-cache"  # no version in its URL


def test_our_javascript_is_at_most_300_lines():
    """Issue 17 item 2: htmx does the requests and swaps; our own JavaScript (every ``*.js`` under
    ``static/`` outside ``vendor/``) is at most 300 non-blank lines in all."""
    static = Path(__file__).resolve().parents[2] / "static"
    ours = [p for p in static.rglob("*.js") if "vendor" not in p.relative_to(static).parts]
    lines = {p.name: sum(1 for line in p.read_text().splitlines() if line.strip()) for p in ours}
    assert "app.js" in lines and "swagger-init.js" in lines, lines
    assert sum(lines.values()) <= 300, lines


def test_page_links_versioned_assets_and_compresses(client):
    r = client.get("/", headers={"Accept-Encoding": "gzip"})
    assert r.headers.get("content-encoding") == "gzip"
    assets = re.findall(r'(?:src|href)="(/static/app\.(?:js|css)\?v=[0-9a-f]{12})"', r.text)
    assert len(assets) == 2
    for url in assets:
        resp = client.get(url)
        assert resp.status_code == 200 and resp.headers["cache-control"] == IMMUTABLE
    plotly = re.search(r'data-plotly="([^"]+)"', r.text).group(1)
    assert client.get(plotly).headers["cache-control"] == IMMUTABLE
    assert "plotly.min.js" not in r.text
    # htmx and its morph extension are served from here, as recorded (no CDN)
    vendor = client.app.state.vendor
    for name in ("htmx", "idiomorph"):
        src = f"/static/vendor/{vendor[name]['file']}"
        assert f'src="{src}"' in r.text
        body = client.get(src)
        assert body.headers["cache-control"] == IMMUTABLE
        assert hashlib.sha256(body.content).hexdigest() == vendor[name]["sha256"]
    assert 'hx-ext="morph"' in r.text and 'hx-sync="this:queue last"' in r.text


def test_page_environment_reads_a_dict_as_jinja_does():
    """The page's cheaper ``x.key`` on a dict (pages.PageEnvironment) answers what Jinja's own
    Environment answers: a key as a key, a dict method as the method (``d.items()``), a key named
    like a method still as the method, a missing key as an error (StrictUndefined), and objects
    other than a plain dict (a subclass, an object with attributes) through Jinja's own rule."""
    from collections import OrderedDict
    from types import SimpleNamespace

    import jinja2

    from app.web.routers.pages import PageEnvironment

    source = ("{{ d.a }}|{{ d.items()|list|length }}|{{ d['items'] }}|{{ d.items is callable }}|"
              "{{ o.a }}|{{ od.a }}|{{ d.n.b }}")
    ctx = {"d": {"a": 1, "items": "key", "n": {"b": "<b>"}}, "o": SimpleNamespace(a=2), "od": OrderedDict(a=3)}
    envs = [cls(autoescape=True, undefined=jinja2.StrictUndefined) for cls in (jinja2.Environment, PageEnvironment)]
    ours, theirs = (e.from_string(source).render(ctx) for e in (envs[1], envs[0]))
    assert ours == theirs == "1|3|key|True|2|3|&lt;b&gt;"
    for env in envs:
        with pytest.raises(jinja2.UndefinedError):
            env.from_string("{{ d.missing }}").render(ctx)


@pytest.mark.parametrize("others", [False, True])
def test_a_live_update_renders_on_the_loop_only_when_alone(client, monkeypatch, others):
    """``/fragment`` renders on the event loop when no other request of the process waits (no
    thread hop) and in a request thread when one does (the loop keeps answering): the same bytes
    either way."""
    from app.web.routers import pages

    hops = []
    real = pages.run_in_threadpool

    async def counted(fn, *args):
        hops.append(fn.__name__)
        return await real(fn, *args)

    query = f"/fragment?model=glm-5.2&split=14,8,8,8,8,8,8,16&{PROFILE}"
    expected = client.get(query).content
    monkeypatch.setattr(pages, "run_in_threadpool", counted)
    monkeypatch.setattr(pages, "other_requests_waiting", lambda: others)
    assert client.get(query).content == expected
    assert hops == (["page_html"] if others else [])


# --------------------------------------------------------------------------- the form sent back only when it changed

class _FormData(HTMLParser):
    """What a browser's ``FormData`` holds for the forms ``ids`` of a page (the settings form and
    the model/engine picker it includes): text, number and hidden inputs by value, checkboxes and
    radios only when checked, a select's selected option (else its first), disabled ones left out;
    then the blanks dropped, as ``static/app.js`` does before htmx sends them."""

    def __init__(self, ids: tuple[str, ...]):
        super().__init__()
        self.ids, self.depth, self.values = ids, 0, []
        self.select: str | None = None
        self.options: list[tuple[str, bool]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.depth = 1 if a.get("id") in self.ids else 0
        if not self.depth or "disabled" in a:
            return
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text")
            if kind not in ("checkbox", "radio") or "checked" in a:
                self.values.append((a["name"], a.get("value", "on" if kind in ("checkbox", "radio") else "")))
        elif tag == "select":
            self.select, self.options = a.get("name"), []
        elif tag == "option" and self.select:
            self.options.append((a.get("value", ""), "selected" in a))

    def handle_endtag(self, tag):
        if tag == "select" and self.select and self.options:
            chosen = [v for v, sel in self.options if sel] or [self.options[0][0]]
            self.values.append((self.select, chosen[-1]))
            self.select = None
        elif tag == "form":
            self.depth = 0


def _page_form(html: str) -> tuple[list[tuple[str, str]], str]:
    """The settings the page's form sends after an edit, and the form's layout mode (``data-mode``)."""
    reader = _FormData(("controls", "pick"))
    reader.feed(html)
    mode = re.search(r'<form id="controls"[^>]*data-mode="(\w+)"', html, re.S)
    assert mode, "the page has no settings form"
    return [(k, v) for k, v in reader.values if v != ""], mode.group(1)


def _answer(client, values: list[tuple[str, str]], shown: str):
    return client.get("/fragment?" + urlencode(values),
                      headers={"HX-Request": "true", "X-Isplan-History": "replace", "X-Isplan-Form": shown})


@pytest.mark.parametrize("start", ["/", "/?model=glm-5.2&engine=megatron&" + "split=14,8,8,8,8,8,8,16&" + PROFILE,
                                   "/?model=glm-5.2&engine=vllm", "/?model=deepseek-v3&engine=sglang",
                                   "/?model=qwen3-235b-a22b&engine=maxtext"])
def test_an_edit_that_leaves_the_form_as_drawn_is_answered_without_it(client, start):
    """The page asks with ``X-Isplan-Form: <mode>:clean``; the answer leaves the settings form out
    exactly when every field would be drawn as the page sent it (each form re-sent costs the page a
    morph of ~200 fields). Derived values - the layout and conversion modes the canonical URL leaves
    out - count as drawn: the pinned slime profile sends ``conv=flags`` it does not hold."""
    page = client.get(start)
    assert page.status_code == 200
    values, mode = _page_form(page.text)
    same = _answer(client, values, f"{mode}:clean")
    assert same.status_code == 200 and 'id="summary"' in same.text
    assert 'id="controls"' not in same.text, "the form came back though nothing in it changed"
    # a field the server rewrites ("04" is drawn as "4") and a page whose form shows a message: drawn again
    tp = [(k, "0" + v if k == "tp" else v) for k, v in values]
    if any(k == "tp" for k, _ in values):
        assert 'id="controls"' in _answer(client, tp, f"{mode}:clean").text
    assert 'id="controls"' in _answer(client, values, f"{mode}:errors").text
