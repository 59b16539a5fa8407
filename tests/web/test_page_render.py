"""The page's rendering shortcuts write exactly what stock Jinja writes.

:class:`app.web.routers.pages.PageTemplate` escapes output with :func:`~app.web.routers.pages.output_escape`
instead of markupsafe's ``escape`` (a ``str``, not a new ``Markup``). Held three ways, none of them
against the code under test's own output: the function against markupsafe's ``escape`` on any
value; every page template rendered by the page's environment against the same templates in a
stock :class:`jinja2.Template` on real views; and the premise - Jinja compiles ``escape(`` only where a
template writes a value out - read off the compiled source of every template.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import Template
from markupsafe import Markup, escape

from app.core.engines.slime import SLIME_GLM52_PROFILE
from app.core.plan import plan_from_query
from app.web.routers.pages import PageEnvironment, output_escape, templates
from app.web.store import ConfigStore
from app.web.view import build_view


class _Html:
    """An object that renders itself as HTML (markupsafe's ``__html__`` protocol)."""

    def __init__(self, text: str):
        self.text = text

    def __html__(self) -> str:
        return self.text


class _Stringy:
    """An object with its own ``str`` (a number-like value a template prints)."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text


_VALUES = (st.text() | st.integers() | st.floats(allow_nan=True) | st.none() | st.booleans()
           | st.text().map(Markup) | st.text().map(_Html) | st.text().map(_Stringy))


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_output_escape_writes_markupsafe_escape_text(value):
    got = output_escape(value)
    assert isinstance(got, str) and (type(got) is str or isinstance(value, Markup))  # no new Markup made
    assert got == str(escape(value))


def test_output_escape_hand_cases():
    # markupsafe's entities, worked out by hand: & < > ' "
    assert output_escape("""a&b<c>d'e"f""") == "a&amp;b&lt;c&gt;d&#39;e&#34;f"
    assert output_escape(Markup("<b>kept</b>")) == "<b>kept</b>"
    assert output_escape(3) == "3" and output_escape(None) == "None"


def test_compiled_templates_escape_only_what_they_write_out():
    """The premise of :func:`output_escape`: in every page template's compiled code, ``escape(``
    is the value written out (``yield``) or a piece collected for a block or macro that joins its
    pieces (``t_N.append(`` / an element of ``t_N.extend((``)."""
    env = templates().env
    for name in env.list_templates():
        source = env.loader.get_source(env, name)[0]
        lines = env.compile(source, name=name, filename=name, raw=True).splitlines()
        for i, line in enumerate(lines):
            for m in re.finditer(r"escape\(", line):
                before = line[:m.start()].strip()
                if before.endswith(("yield", ".append(")):
                    continue
                opener = next(lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].rstrip().endswith("(("))
                assert not before and re.fullmatch(r"t_\d+\.extend\(\(", opener), f"{name}: {line.strip()[:120]}"


@pytest.fixture(scope="module")
def stock_env():
    """The page's environment with stock templates (markupsafe's ``escape`` on every output)."""
    page = templates().env
    env = PageEnvironment(loader=page.loader, autoescape=page.autoescape, auto_reload=False)
    env.template_class = Template
    env.undefined = page.undefined
    env.policies.update(page.policies)
    env.filters.update(page.filters)
    env.globals.update(page.globals)
    return env


QUERIES = ("", "split=14,9,7,8,8,8,8,16", "split=13,26,13,26&vpp=2", "split=1,77", "pp=abc&frist=1",
           "engine=megatron&pp=4&vpp=2&tp=2&ep=8&gpu=b200-180gb&precision=mxfp8",
           "engine=vllm&split=40,38", "engine=sglang", "engine=maxtext", "engine=hf&split=39,39")


@pytest.mark.parametrize("query", QUERIES)
def test_page_templates_render_as_stock_jinja_renders_them(query, stock_env, tmp_path):
    from starlette.requests import Request

    from app.web.app import create_app

    app = create_app()
    plan, problems = plan_from_query(dict(parse_qsl(query)), empty=SLIME_GLM52_PROFILE)
    view = build_view(plan, problems, ConfigStore(tmp_path / "s.sqlite3"))
    request = Request({"type": "http", "method": "GET", "path": "/", "query_string": query.encode(), "headers": [],
                       "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "", "app": app})
    for name in ("index.html", "_fragment.html"):
        ctx = app.state.page_context(request, view, compare=None, same_form=False)
        page = templates().env.get_template(name).render(ctx)
        stock = stock_env.get_template(name).render(ctx)
        assert page == stock, name
