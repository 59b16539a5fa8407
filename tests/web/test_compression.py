"""gzip answers (app.web.compression): ISA-L's deflate in Starlette's gzip middleware.

Each compressed body is decoded with the standard library's :mod:`gzip` (an independent reader of
RFC 1952) and compared with the same request asked without ``Accept-Encoding``.
"""

from __future__ import annotations

import gzip
import re
import zlib

import pytest

from app.web import compression

FRAGMENT = "/fragment?model=glm-5.2&mode=split&split=14,16,16,16,16"


def test_the_installed_dependency_does_the_compression():
    """``isal`` is a dependency of the package (pyproject.toml): the fast path is the one that runs."""
    assert compression.ENGINE == "isa-l"
    assert type(compression.compressor(1)).__module__.startswith("isal")


def test_a_live_update_fragment_decodes_to_the_uncompressed_answer(client):
    plain = client.get(FRAGMENT, headers={"Accept-Encoding": "identity"})
    packed = client.get(FRAGMENT, headers={"Accept-Encoding": "gzip"})
    assert plain.status_code == packed.status_code == 200
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip" and "accept-encoding" in packed.headers["vary"].lower()
    # httpx decodes the body with zlib; the length on the wire is what the server wrote
    wire = int(packed.headers["content-length"])
    assert packed.content == plain.content and wire < len(plain.content) / 3


def test_a_streamed_static_file_decodes_whole(client):
    """A file is sent in chunks (``more_body``): each chunk is flushed with ``Z_SYNC_FLUSH``, the last
    one finishes the stream; the concatenation is one gzip member."""
    page = client.get("/")
    plotly = re.search(r'data-plotly="([^"]+)"', page.text).group(1)
    plain = client.get(plotly, headers={"Accept-Encoding": "identity"})
    with client.stream("GET", plotly, headers={"Accept-Encoding": "gzip"}) as r:
        assert r.headers["content-encoding"] == "gzip"
        raw = b"".join(r.iter_raw())
    assert len(plain.content) > 1_000_000 and gzip.decompress(raw) == plain.content


def test_a_small_answer_is_sent_as_it_is(client):
    r = client.get("/healthz", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers


@pytest.mark.parametrize("fast", [True, False])
def test_both_compressors_write_gzip_that_the_standard_library_reads(monkeypatch, fast):
    """Without ``isal`` (a platform it has no wheel for) zlib writes the same format."""
    if not fast:
        monkeypatch.setattr(compression, "deflate", None)
    data = b"<div class=\"cell full\">F</div>\n" * 4000 + bytes(range(256)) * 8
    c = compression.compressor(1)
    head = c.compress(data[:50_000]) + c.flush(zlib.Z_SYNC_FLUSH)
    out = head + c.compress(data[50_000:]) + c.flush()
    assert gzip.decompress(out) == data and len(out) < len(data) / 10
    # the part flushed so far already decodes to the part sent so far (what a streaming reader sees)
    assert zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head) == data[:50_000]
