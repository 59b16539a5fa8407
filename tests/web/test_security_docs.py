"""/docs on the vendored Swagger UI: the files are the recorded ones, and the page loads nothing
but same-origin scripts (issue 9: /docs loaded Swagger from a CDN that the app's CSP blocks)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.testclient import TestClient

from app.web.security import secure, swagger_ui_html

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "static"
CSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"


def test_vendored_files_match_vendor_json():
    vendor = json.loads((STATIC / "vendor" / "VENDOR.json").read_text())["swagger-ui"]
    assert vendor["version"] == "5.35.0"
    for name, digest in vendor["files"].items():
        data = (STATIC / "vendor" / "swagger-ui" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
    assert "swagger-ui-bundle.js" in vendor["files"] and "swagger-ui.css" in vendor["files"]
    assert "SwaggerUIBundle" in (STATIC / "vendor" / "swagger-ui" / "swagger-ui-bundle.js").read_text()


def test_the_page_has_no_inline_script_and_no_other_origin():
    page = swagger_ui_html("/openapi.json")
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, flags=re.DOTALL)
    assert len(scripts) == 2 and all('src="/static/' in attrs and body == "" for attrs, body in scripts)
    assert "http" not in page  # no absolute URL: nothing from another origin
    assert 'data-openapi-url="/openapi.json"' in page
    assert "&quot;&gt;" in swagger_ui_html('/x"><script>')  # the URL is escaped


def test_docs_and_its_assets_are_served_under_the_csp():
    app = FastAPI(docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(swagger_ui_html(app.openapi_url or "/openapi.json"))

    client = TestClient(secure(app, csp=CSP))  # type: ignore[arg-type]
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-security-policy"] == CSP
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        r = client.get(ref)
        assert r.status_code == 200 and len(r.content) > 100, ref
    assert client.get("/openapi.json").json()["openapi"].startswith("3.")
