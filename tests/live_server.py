"""A real ``python -m app.serve`` for the round-3 regression tests (issue 20), and the probes they
share: ``/healthz`` latency under load, the server's processes and their memory, raw sockets.

Nothing here imports pytest. :class:`LiveServer` starts the server exactly as ``make serve`` and
the Dockerfile do, on a free loopback port, with its data directory and ``TMPDIR`` in a directory
of the caller's choosing (so a test can look for files it leaves behind), and stops it with
SIGTERM as an operator (or Docker) does.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.browser_support import REPO, free_port

#: The budget of issue 20: no request may push /healthz p99 over max(100 ms, 10 x its idle p99).
HEALTHZ_FLOOR = 0.100
RSS_LIMIT = 512 << 20


class LiveServer:
    def __init__(self, root: Path, **env: str):
        self.root = Path(root)
        self.data = self.root / "data"
        self.tmp = self.root / "tmp"
        self.env = env
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> LiveServer:
        self.data.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = {**os.environ, "ISPLAN_DATA_DIR": str(self.data), "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1",
               "ISPLAN_SERVER_WORKERS": "1", "ISPLAN_WORKERS": "2", **self.env}
        if "ISPLAN_DATABASE_URL" not in self.env:
            env.pop("ISPLAN_DATABASE_URL", None)
        self.log = (self.root / f"server-{self.port}.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "app.serve", "--port", str(self.port)], cwd=REPO, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log_text()}")
            try:
                if get(self.port, "/healthz", timeout=2)[0] in (200, 503):
                    time.sleep(0.5)  # the planner workers are up too
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the server did not answer: {self.log_text()}")

    def log_text(self) -> str:
        return (self.root / f"server-{self.port}.log").read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.log.close()
        return proc.returncode

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def get(port: int, path: str, *, headers: dict[str, str] | None = None, timeout: float = 30,
        source: str | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                      source_address=(source, 0) if source else None)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post(port: int, path: str, body: bytes, headers: dict[str, str], timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def multipart(fields: dict[str, tuple[str, bytes] | str], boundary: str = "isplan-test") -> tuple[bytes, dict[str, str]]:
    parts = []
    for name, value in fields.items():
        if isinstance(value, tuple):
            filename, data = value
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                         "Content-Type: application/json\r\n\r\n".encode() + data + b"\r\n")
        else:
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(port: int, data: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    body, h = multipart({"file": ("config.json", data), "query": "model=glm-5.2"})
    return post(port, "/upload", body, {**h, **headers})


class HealthProbe:
    """``/healthz`` every ``every`` seconds on its own keep-alive connection, from a separate
    process (:mod:`tests.healthz_probe`): a thread of the test process would time its own wait for
    the GIL behind the load threads, not the server."""

    def __init__(self, port: int, every: float = 0.02):
        self.port, self.every = port, every
        self.samples: list[float] = []
        self.failures: list[str] = []
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> HealthProbe:
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.healthz_probe", str(self.port), str(self.every)],
                                      cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the /healthz probe did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End the probe and collect its samples (idempotent)."""
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        result = json.loads(out.strip().splitlines()[-1])
        self.samples, self.failures = result["samples"], result["failures"]

    def p99(self) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))] if s else float("inf")


def idle_p99(port: int, seconds: float = 1.0) -> float:
    """``/healthz`` p99 of an idle server: a probe every 10 ms for ``seconds`` (about 60 samples)."""
    with HealthProbe(port, every=0.01) as probe:
        time.sleep(seconds)
    return probe.p99()


def healthz_budget(idle: float) -> float:
    return max(HEALTHZ_FLOOR, 10 * idle)


# --------------------------------------------------------------------------- processes


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from "state" on


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and int(st[1]) == pid:
                out.append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def cpu_ticks(pid: int) -> int:
    st = _stat(pid)
    return int(st[11]) + int(st[12]) if st else 0  # utime + stime


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def max_rss(pid: int) -> int:
    return max([rss_bytes(p) for p in [pid, *descendants(pid)]] or [0])


def held_sockets(port: int, n: int, source: str) -> list[socket.socket]:
    """``n`` connections from ``source`` (a loopback address such as 127.0.0.2) that send nothing."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def is_closed(sock: socket.socket, wait: float = 0.5) -> bool:
    """Whether the server closed ``sock`` (EOF or reset within ``wait`` seconds)."""
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True
