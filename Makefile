# isplan: two entry points, each doing its own set-up on a fresh machine.
#   make serve  - the dashboard on http://127.0.0.1:8000 (GLM-5.2 preset); make serve PORT=9000 HOST=0.0.0.0
#   make test   - the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

CHROMIUM ?= /usr/bin/chromium
HOST     ?= 127.0.0.1
PORT     ?= 8000

.PHONY: serve test test-fast lint venv bench clean browser screenshot

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# setuptools' default editable mode: `app` imports from the checkout, which serves its own
	# templates/ and static/ (app/web/assets.py); "compat" warns on every install since setuptools 80.
	# Every editable mode prints setuptools' "Editable installation." notice, an InformationOnly
	# "warning" for want of another channel (pypa/packaging-problems#558), which pip >= 25 shows even
	# with --quiet: that one message, and only it, is filtered.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet -e ".[test,postgres]"
	touch $(STAMP)

venv: $(STAMP)

# several server processes with the slow-client limits (app/serve.py; the Dockerfile runs the same)
serve: $(STAMP)
	$(BIN)/python -m app.serve --host $(HOST) --port $(PORT)

# Browser tests drive Debian's Chromium through Playwright (no browser download).
browser:
	@command -v $(CHROMIUM) >/dev/null 2>&1 || { \
	  echo "installing Debian chromium (browser tests need it)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Lint (ruff) and types (mypy) first: a new finding fails the build.
lint: $(STAMP)
	$(BIN)/ruff check app tests bench scripts
	$(BIN)/mypy

# The suite in two parts, both run even when the first fails (the status is the worse of the two):
# every test that runs in this process or a short command, spread over one pytest-xdist worker per
# core (JOBS=auto); then, one at a time, the tests marked `exclusive` - Chromium, a live server,
# worker pools, latency under load - which want the machine to themselves.
JOBS ?= auto
test: $(STAMP) browser lint
	@status=0; \
	$(BIN)/python -m pytest -n $(JOBS) --dist worksteal -m "not exclusive" || status=$$?; \
	ISPLAN_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -m exclusive || status=$$?; \
	exit $$status

# The edit loop: lint, then everything but the browser, install and schemathesis runs, stopping at
# the first failure, in the same two parts as `make test` (about 2.5 minutes on 2 cores).
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -q -x -n $(JOBS) --dist worksteal -m "not slow and not exclusive" \
	  --ignore=tests/browser --ignore=tests/test_install.py --ignore=tests/web/test_schemathesis.py
	$(BIN)/python -m pytest -q -x -m "exclusive and not slow"

screenshot: $(STAMP) browser
	ISPLAN_CHROMIUM=$(CHROMIUM) $(BIN)/python -m scripts.screenshot docs/screenshot.png

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
