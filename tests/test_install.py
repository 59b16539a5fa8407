"""The Dockerfile's install and start steps, run for real in a fresh venv (no Docker engine here).

Parses the Dockerfile for its pip install and CMD lines so the two cannot drift apart, and checks
that ``make serve`` starts the same entry point (``python -m app.serve``), which runs several
server processes (issue 9: "make serve and the Dockerfile run with several workers")."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO


def _dockerfile_steps() -> tuple[str, list[str]]:
    text = (REPO / "Dockerfile").read_text()
    install = re.search(r"RUN python -m venv /opt/venv && /opt/venv/bin/(pip install [^\n]+)", text)
    cmd = re.search(r'^CMD (\[.*\])$', text, re.M)
    assert install and cmd, "Dockerfile must keep its venv install and exec-form CMD"
    return install.group(1), json.loads(cmd.group(1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fresh_venv_install_start_and_healthz(tmp_path):
    install, cmd = _dockerfile_steps()
    src = tmp_path / "src"
    src.mkdir()
    # the Dockerfile copies exactly these into the image
    shutil.copy(REPO / "pyproject.toml", src)
    shutil.copy(REPO / "README.md", src)
    for folder in ("app", "templates", "static"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "Dockerfile").read_text()
    assert all(f"COPY {f} ./{f}" in text for f in ("app", "templates", "static"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip_args = install.split()[2:]  # after "pip install"
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", *pip_args], cwd=src, check=True,
                          timeout=900, capture_output=True, text=True)
    assert "Warning" not in done.stdout + done.stderr, done.stderr  # issue 17: an install prints no warning
    port = _free_port()
    exe = [str(venv / "bin" / cmd[0].rsplit("/", 1)[-1]), *cmd[1:]]
    exe[exe.index("--port") + 1] = str(port)
    exe[exe.index("--host") + 1] = "127.0.0.1"
    work = tmp_path / "home"
    work.mkdir()
    log_path = tmp_path / "server.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(exe, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        body = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    body = json.loads(r.read())
                    break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.3)
        assert body is not None, log_path.read_text() if proc.poll() is not None else "no answer"
        assert body["status"] == "ok" and body["store"]["ok"] is True
        # several server processes behind the one port (uvicorn logs each one's start)
        deadline = time.monotonic() + 30
        while log_path.read_text().count("Application startup complete") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert log_path.read_text().count("Started server process") >= 2, log_path.read_text()
        head = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", method="HEAD")
        with urllib.request.urlopen(head, timeout=5) as r:
            assert r.status == 200 and r.headers["x-frame-options"] == "DENY" and r.read() == b""
        # the page renders from the installed package's own templates and assets
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            page = r.read().decode()
        assert "256 GPUs" in page and "VALID" in page
        assert 'id="time-accuracy"' in page   # the package's data file (app/core/data/*.json) was installed
        for asset in ("/static/app.js", "/static/vendor/plotly-basic-4.1.1.min.js",
                      "/static/vendor/swagger-ui/swagger-ui-bundle.js"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{asset}", timeout=10) as r:
                assert r.status == 200 and len(r.read()) > 1000
        # the installed console script works from outside the source tree too
        out = subprocess.run([str(venv / "bin" / "isplan"), "check", "glm-5.2", "--split", "14,8,8,8,8,8,8,16"],
                             capture_output=True, text=True, cwd=work)
        assert out.returncode == 0 and "VALID" in out.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.mark.slow
def test_make_venvs_editable_install_prints_no_warning(tmp_path):
    """``make venv``'s editable install (the Makefile's own pip line, without the extras' downloads)
    prints no setuptools warning, and the checkout's app serves its assets from the checkout."""
    line = re.search(r'(?:PYTHONWARNINGS="([^"]*)" )?\$\(BIN\)/pip install --quiet -e "\.\[[^\]]*\]"([^\n]*)',
                     (REPO / "Makefile").read_text())
    assert line, "make venv must keep its editable pip install"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = str(venv / "bin" / "pip")
    subprocess.run([pip, "install", "--quiet", "--upgrade", "pip"], check=True, capture_output=True, timeout=600)  # as make does
    env = {**os.environ, **({"PYTHONWARNINGS": line.group(1)} if line.group(1) else {})}
    done = subprocess.run([pip, "install", "--quiet", "--no-deps", "-e", ".", *line.group(2).split()],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and "Warning" not in done.stdout + done.stderr, done.stderr
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "from app.web.assets import asset_dir; print(asset_dir('static'))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == str(REPO / "static"), out.stderr


def test_make_serve_runs_the_dockerfile_entry_point():
    _, cmd = _dockerfile_steps()
    assert cmd[1:3] == ["-m", "app.serve"], cmd
    serve = re.search(r"^serve:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert serve and "-m app.serve" in serve.group(1), "make serve must start python -m app.serve"


def test_every_package_is_installed():
    """pyproject lists its packages by hand: every folder of app/ with an __init__.py must be among
    them, or the installed app fails to import (found when app.web.routers was missing)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "app").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
