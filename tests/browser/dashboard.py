"""Reading and moving the dashboard in a Playwright page: the verdict, the layer map's boundaries
and cells, the URL's query, the form's values, a pointer drag. Shared by the browser tests."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from browser_support import REPO
from playwright.sync_api import Page

PRESET = REPO / "app" / "core" / "presets" / "glm-5.2.json"
GLM52_FULL = [1, 2, 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75]
DEFAULT_STARTS = [15, 23, 31, 39, 47, 55, 63]  # stages 2..8 of first 14 / last 16, PP 8
# app.core.plan.SLIME_GLM52_PROFILE (slime's run-glm5.2-744B-A40B.sh) spelled out, without its layout
# full recompute needs a method and a layer count, DSA with CP the all-gather layout (Megatron-LM
# transformer_config.py:1913-1925, 3162-3177)
PROFILE_PARALLEL = ("tp=4&cp=8&ep=32&etp=1&dp=1&sp=1&tpg=8192&recompute=full&rmethod=uniform&rnl=1"
                    "&cp_comm_type=allgather&offload=1&d2h=1&pao=1")
HOSTILE = "<img src=x onerror=alert(1)>"



def updated(page: Page, action: Callable[[], object]) -> None:
    """Run ``action`` and wait until an htmx swap landed (app.js stamps body[data-updated])."""
    before = page.evaluate("() => document.body.dataset.updated || ''")
    action()
    page.wait_for_function("b => (document.body.dataset.updated || '') !== b", arg=before)


def settle(page: Page) -> None:
    """Number inputs also fire a delayed ``input`` trigger (250 ms); let it run and land."""
    page.wait_for_timeout(400)
    page.wait_for_function("() => !document.querySelector('.htmx-request')")


def verdict(page: Page) -> str:
    return page.locator("#verdict").inner_text().strip()


def boundaries(page: Page) -> list[tuple[str, int]]:
    return [tuple(b) for b in page.evaluate("""() => Array.from(document.querySelectorAll('#layer-map .boundary'))
        .map(b => [b.dataset.stage, Number(b.getAttribute('aria-valuenow'))])""")]


def query(page: Page) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(page.url).query, keep_blank_values=True).items()}


def cell(page: Page, layer: int):
    return page.locator(f'#layer-map .cell[data-layer="{layer}"]')


def boundary(page: Page, stage: int):
    return page.locator(f'#layer-map .boundary[data-stage="{stage}"]')


def focused_boundary(page: Page) -> tuple[str | None, str | None]:
    return tuple(page.evaluate("""() => { const e = document.activeElement;
        return e && e.classList.contains('boundary') ? [e.dataset.stage, e.getAttribute('aria-valuenow')] : [null, null]; }"""))


def form_values(page: Page) -> list[tuple[str, str]]:
    return [tuple(x) for x in page.evaluate("""() => Array.from(document.querySelectorAll('#controls [name]'))
        .map(e => [e.id || e.name, e.type === 'checkbox' ? String(e.checked) : e.value])""")]


def drag_boundary(page: Page, stage: int, layer: int) -> None:
    b = boundary(page, stage).bounding_box()
    c = cell(page, layer).bounding_box()
    assert b and c
    page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)
    page.mouse.down()
    page.mouse.move(c["x"] + c["width"] / 2, c["y"] + c["height"] / 2, steps=6)
    page.mouse.up()


def violations(page: Page) -> list[str]:
    return page.locator("#violations li.err").all_inner_texts()
