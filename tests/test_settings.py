"""One settings object (issue 16 item 6): every ``ISPLAN_*`` variable is read in app/settings.py
only, each field has its variable, type, default and bounds, a bad value is an error naming the
variable, and the README's Settings table lists exactly these variables."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import VARIABLES, Settings, SettingsError, current, specs

REPO = Path(__file__).resolve().parents[1]


def test_defaults_without_any_variable():
    s = Settings.from_env({})
    assert s.data_dir == Path("data") and s.database_url is None and s.upload_token is None
    assert (s.upload_quota_bytes, s.upload_client_quota_bytes) == (512 << 20, 32 << 20)
    assert (s.work_budget, s.work_deadline, s.worker_memory) == (20_000_000, 20.0, 2 << 30)
    assert (s.header_seconds, s.body_seconds, s.server_workers, s.work_per_client) == (10.0, 30.0, 2, 2)
    assert s.workers == min(os.cpu_count() or 1, 4)
    assert s.allowed_origins == () and s.allowed_hosts == () and s.connections_per_client == 128


def test_every_value_is_parsed_to_its_type():
    env = {"ISPLAN_DATA_DIR": "/srv/isplan", "ISPLAN_DATABASE_URL": "postgresql:///isplan",
           "ISPLAN_UPLOAD_TOKEN": "t", "ISPLAN_UPLOAD_QUOTA_BYTES": "1_000", "ISPLAN_UPLOAD_CLIENT_QUOTA_BYTES": "0",
           "ISPLAN_UPLOAD_RATE_BYTES": str(4 << 20), "ISPLAN_RECEIPT_KEY": "k", "ISPLAN_SERVER_WORKERS": "3",
           "ISPLAN_WORKERS": "1", "ISPLAN_WORK_PER_CLIENT": "5", "ISPLAN_WORK_BUDGET": "5000",
           "ISPLAN_WORK_DEADLINE": "2.5", "ISPLAN_WORKER_MEMORY": "0", "ISPLAN_HEADER_SECONDS": "1",
           "ISPLAN_BODY_SECONDS": "0.5", "ISPLAN_CONNECTIONS_PER_CLIENT": "7",
           "ISPLAN_ALLOWED_ORIGINS": "https://a.example, http://b.example:8080",
           "ISPLAN_ALLOWED_HOSTS": "plans.example.com,.corp.example, 10.0.0.5"}
    assert set(env) == set(VARIABLES)  # the test names every variable there is
    s = Settings.from_env(env)
    assert s.data_dir == Path("/srv/isplan") and s.database_url == "postgresql:///isplan"
    assert (s.upload_quota_bytes, s.upload_client_quota_bytes, s.upload_rate_bytes) == (1000, 0, 4 << 20)
    assert (s.server_workers, s.workers, s.work_per_client, s.work_budget) == (3, 1, 5, 5000)
    assert (s.work_deadline, s.worker_memory, s.header_seconds, s.body_seconds) == (2.5, 0, 1.0, 0.5)
    assert s.allowed_origins == ("https://a.example", "http://b.example:8080")
    assert s.allowed_hosts == ("plans.example.com", ".corp.example", "10.0.0.5")
    assert s.connections_per_client == 7 and s.receipt_key == "k" and s.upload_token == "t"


def test_an_empty_variable_is_its_default():
    assert Settings.from_env({"ISPLAN_WORKERS": "", "ISPLAN_UPLOAD_TOKEN": "  "}) == Settings.from_env({})


@pytest.mark.parametrize(("variable", "value", "needle"), [
    ("ISPLAN_WORKERS", "many", "must be a whole number"),
    ("ISPLAN_WORKERS", "0", "must be at least 1"),
    ("ISPLAN_WORKERS", "65", "must be at most 64"),
    ("ISPLAN_UPLOAD_QUOTA_BYTES", "lots", "must be a whole number of bytes"),
    ("ISPLAN_UPLOAD_QUOTA_BYTES", "-1", "must be at least 0 bytes"),
    ("ISPLAN_UPLOAD_RATE_BYTES", "1000", "must be at least 2,097,152 bytes"),
    ("ISPLAN_WORKER_MEMORY", "1000", "must be at least 268,435,456 bytes (or 0)"),
    ("ISPLAN_WORK_DEADLINE", "nan", "must be a finite number of seconds"),
    ("ISPLAN_WORK_DEADLINE", "0", "must be more than 0 seconds"),
    ("ISPLAN_HEADER_SECONDS", "1e9", "must be at most 3,600 seconds"),
    ("ISPLAN_BODY_SECONDS", "soon", "must be a number of seconds"),
    ("ISPLAN_WORK_BUDGET", "10", "must be at least 1,000"),
    ("ISPLAN_ALLOWED_ORIGINS", "evil.example", "scheme://host[:port]"),
    ("ISPLAN_ALLOWED_ORIGINS", "https://a.example/path", "no path"),
    ("ISPLAN_ALLOWED_HOSTS", "a b.example", "host names"),
    ("ISPLAN_ALLOWED_HOSTS", "http://a.example", "host names"),
    ("ISPLAN_CONNECTIONS_PER_CLIENT", "0", "must be at least 1"),
    ("ISPLAN_RECEIPT_KEY", "k" * 5000, "at most 4,096 characters"),
])
def test_a_bad_value_is_an_error_naming_the_variable(variable, value, needle):
    with pytest.raises(SettingsError) as exc:
        Settings.from_env({variable: value})
    assert str(exc.value).startswith(variable + " ") and needle in str(exc.value), str(exc.value)
    assert exc.value.variable == variable


def test_only_parses_the_fields_asked_for():
    """The CLI reads the receipt key and is not refused for a bad server setting it never uses."""
    env = {"ISPLAN_WORKERS": "many", "ISPLAN_RECEIPT_KEY": "k"}
    assert Settings.from_env(env, only=("receipt_key",)).receipt_key == "k"
    with pytest.raises(SettingsError, match="ISPLAN_WORKERS"):
        Settings.from_env(env)


def test_current_follows_the_environment(monkeypatch):
    monkeypatch.setenv("ISPLAN_WORK_BUDGET", "1234")
    assert current().work_budget == 1234
    monkeypatch.setenv("ISPLAN_WORK_BUDGET", "4321")
    assert current().work_budget == 4321
    monkeypatch.delenv("ISPLAN_WORK_BUDGET")
    assert current().work_budget == 20_000_000


def test_every_field_documents_its_variable_and_default():
    for name, spec in specs().items():
        assert spec.variable.startswith("ISPLAN_") and spec.help and spec.default_text, name
    assert len(set(VARIABLES)) == len(VARIABLES) == 18


def test_only_the_settings_module_reads_the_environment():
    """No other module of app/ reads os.environ / os.getenv (so no ISPLAN_* variable is read twice)."""
    readers = []
    for path in (REPO / "app").rglob("*.py"):
        if path.name == "settings.py" and path.parent.name == "app":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not readers, readers


def test_every_isplan_variable_named_in_app_is_a_setting():
    named = set()
    for path in (REPO / "app").rglob("*.py"):
        named |= set(re.findall(r"ISPLAN_[A-Z_]+[A-Z]", path.read_text()))
    assert named <= set(VARIABLES), sorted(named - set(VARIABLES))


def test_the_readme_settings_table_lists_exactly_these_variables():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Settings", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `ISPLAN_")]
    listed = set()
    for row in rows:
        listed |= set(re.findall(r"`(ISPLAN_[A-Z_]+)`", row.split("|")[1]))
    assert listed == set(VARIABLES), (sorted(set(VARIABLES) - listed), sorted(listed - set(VARIABLES)))


def test_the_server_refuses_to_start_on_a_bad_setting_in_one_line():
    env = {**os.environ, "ISPLAN_CONNECTIONS_PER_CLIENT": "none"}
    out = subprocess.run([sys.executable, "-m", "app.serve", "--port", "1"], env=env, capture_output=True,
                         text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == ("python -m app.serve: error: ISPLAN_CONNECTIONS_PER_CLIENT must be a whole number, "
                                  "got 'none'")
