"""Issue 9's findings that need a real server process: the app started exactly as ``make serve``
starts it (``python -m app.serve``), with short header/body deadlines, plus the CLI's bounded
reads run as a user runs them.

* a request head or body that never completes is cut off (slowloris, stalled uploads);
* 44 concurrent ``plan-search`` requests (the issue's number) leave ``/healthz`` answering;
* ``isplan --launcher -``, ``verify -``, ``/dev/zero`` and FIFOs exit 2 with one line.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.browser_support import free_port

#: a live server, worker processes or latency under load: run on its own (the Makefile's second part)
pytestmark = pytest.mark.exclusive

REPO = Path(__file__).resolve().parents[2]
HEAD_SECONDS = 1.0
BODY_SECONDS = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``python -m app.serve`` on a free port, its data in a temporary directory."""
    data = tmp_path_factory.mktemp("live")
    port = free_port()
    env = {**os.environ, "ISPLAN_DATA_DIR": str(data), "ISPLAN_HEADER_SECONDS": str(HEAD_SECONDS),
           "ISPLAN_BODY_SECONDS": str(BODY_SECONDS), "ISPLAN_SERVER_WORKERS": "1", "ISPLAN_WORKERS": "2"}
    env.pop("ISPLAN_DATABASE_URL", None)
    log = (data / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.serve", "--port", str(port)], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if _get(port, "/healthz")[0] == 200:
                break
        except OSError:
            assert proc.poll() is None, (data / "server.log").read_text()
            time.sleep(0.2)
    yield port
    proc.terminate()
    proc.wait(20)
    log.close()


def _get(port: int, path: str, timeout: float = 30) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """Everything the server sent and the seconds until it closed (None: still open)."""
    sock.settimeout(seconds)
    t0 = time.monotonic()
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except TimeoutError:
        return data, None
    return data, time.monotonic() - t0


def test_a_head_that_never_completes_is_cut_off(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for _ in range(3):  # trickling header lines does not extend the deadline
            time.sleep(0.2)
            s.sendall(b"X-Slow: 1\r\n")
        _, closed = _read_until_closed(s, 5 * HEAD_SECONDS)
    assert closed is not None


def test_a_stalled_upload_body_is_a_408_with_the_security_headers(server):
    with socket.create_connection(("127.0.0.1", server)) as s:
        s.sendall(b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Content-Length: 100000\r\n\r\n--b\r\n")
        data, closed = _read_until_closed(s, 10 * BODY_SECONDS)
    assert closed is not None and data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"x-frame-options: DENY" in data and b"content-security-policy" in data


def test_44_concurrent_plan_searches_leave_healthz_answering(server):
    """Issue 9: 44 concurrent plan-search requests made /healthz unavailable for 30-110 s. Now
    each client gets at most its share of the worker pool (429 beyond it) and the server's event
    loop never runs the search, so /healthz answers throughout."""
    query = "/api/v1/plan-search?model=glm-5.2&pp=4&vpp=4&top=100&objective=balanced"

    def search(_: int) -> int:
        return _get(server, query, timeout=60)[0]

    latencies = []
    with ThreadPoolExecutor(44) as pool:
        futures = [pool.submit(search, i) for i in range(44)]
        while not all(f.done() for f in futures):
            t0 = time.monotonic()
            status, _ = _get(server, "/healthz", timeout=10)
            latencies.append(time.monotonic() - t0)
            assert status == 200
            time.sleep(0.02)
        statuses = [f.result() for f in futures]
    assert set(statuses) <= {200, 429, 503}, statuses
    assert 200 in statuses and 429 in statuses  # one client: its share runs, the rest is told to wait
    latencies.sort()
    assert latencies[-1] < 2.0, latencies[-5:]


# ----------------------------------------------------------------------------- the CLI


def _isplan(*args: str, stdin: bytes | None = None, stdin_file: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "app", *args]
    if stdin_file is None:
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=30, cwd=REPO)
    with open(stdin_file, "rb") as fh:
        return subprocess.run(cmd, stdin=fh, capture_output=True, timeout=30, cwd=REPO)


def _one_line_exit_2(out: subprocess.CompletedProcess, *needles: str) -> None:
    err = out.stderr.decode()
    assert out.returncode == 2, (out.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert all(n in err for n in needles), err


def test_cli_launcher_from_endless_stdin_is_bounded():
    _one_line_exit_2(_isplan("check", "glm-5.2", "--launcher", "-", stdin_file="/dev/zero"), "1,048,576 bytes")


def test_cli_verify_from_endless_stdin_is_bounded():
    _one_line_exit_2(_isplan("verify", "-", stdin_file="/dev/zero"), "1,048,576 bytes")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_cli_refuses_devices():
    _one_line_exit_2(_isplan("verify", "/dev/zero"), "/dev/zero", "not a regular file")
    _one_line_exit_2(_isplan("check", "glm-5.2", "--launcher", "/dev/zero"), "/dev/zero")


def test_cli_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    _one_line_exit_2(_isplan("verify", str(fifo)), "FIFO")
    _one_line_exit_2(_isplan("check", "glm-5.2", "--launcher", str(fifo)), "FIFO")
    assert time.monotonic() - t0 < 20


def test_cli_verify_refuses_deep_nesting_and_huge_mtp_in_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    _one_line_exit_2(_isplan("verify", str(deep)), "deeper than")
    receipt = {"model": {"id": "glm-5.2", "source": "preset"}, "engine": {"semantics": "megatron"},
               "layouts": [{"name": "t", "inputs": {"pp": 8, "first": 14, "last": 16, "mtp_layers": 10**9}}]}
    _one_line_exit_2(_isplan("verify", "-", stdin=json.dumps(receipt).encode()), "mtp_layers")
