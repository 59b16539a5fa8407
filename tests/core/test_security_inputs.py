"""app.core.inputs.read_bounded: the CLI reads only regular files (or stdin) and never more than
the limit; FIFOs, devices and directories are refused before a byte is read (issue 9)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from app.core.inputs import InputError, decode_utf8, read_bounded, read_text_bounded


def test_regular_file_within_limit(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 100)
    assert read_bounded(str(path), limit=100, what="receipt") == b"x" * 100


def test_too_large_file_refused_naming_file_and_limit(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 101)
    with pytest.raises(InputError) as exc:
        read_bounded(str(path), limit=100, what="receipt")
    msg = str(exc.value)
    assert "receipt" in msg and str(path) in msg and "101 bytes" in msg and "limit is 100 bytes" in msg
    assert "\n" not in msg


def test_fifo_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # No writer ever opens the FIFO: a blocking open would hang; the test thread would never finish.
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: result.append(_raises(str(fifo))), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "opening a FIFO blocked"
    assert isinstance(result[0], InputError) and "FIFO" in str(result[0]) and str(fifo) in str(result[0])


def _raises(path: str) -> BaseException:
    try:
        read_bounded(path, limit=1 << 20, what="--launcher")
    except BaseException as exc:
        return exc
    return AssertionError("no error")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_devices_refused(device):
    if not os.path.exists(device):
        pytest.skip(f"{device} missing")
    with pytest.raises(InputError, match="character device"):
        read_bounded(device, limit=1 << 20, what="--launcher")


def test_directory_refused(tmp_path):
    with pytest.raises(InputError, match="a directory"):
        read_bounded(str(tmp_path), limit=10, what="--config")


def test_missing_file_named(tmp_path):
    with pytest.raises(InputError, match=r"cannot read --config .*nope.*No such file"):
        read_bounded(str(tmp_path / "nope"), limit=10, what="--config")


def test_stdin_within_and_over_limit(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y" * 50)))
    assert read_bounded("-", limit=50, what="receipt") == b"y" * 50
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y" * 51)))
    with pytest.raises(InputError, match=r"standard input.*limit is 50 bytes"):
        read_bounded("-", limit=50, what="receipt")


def test_endless_stdin_stops_at_limit():
    """/dev/zero on stdin (a device, endless) is cut off at limit + 1 bytes, in a real process."""
    code = ("import sys; from app.core.inputs import read_bounded, InputError\n"
            "try:\n    read_bounded('-', limit=1 << 20, what='receipt')\n"
            "except InputError as e:\n    print(e)\n")
    with open("/dev/zero", "rb") as zero:
        p = subprocess.run([sys.executable, "-c", code], check=False, stdin=zero, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "larger than that; the limit is 1,048,576 bytes" in p.stdout


def test_utf8_errors_named(tmp_path):
    path = tmp_path / "latin1.sh"
    path.write_bytes(b"ab\xe9cd")
    with pytest.raises(InputError, match=r"--launcher .*latin1.sh is not UTF-8 text: byte 2 \(0xe9\)"):
        read_text_bounded(str(path), limit=100, what="--launcher")
    assert decode_utf8(b"\xef\xbb\xbfok", what="x", name="y") == "ok"
