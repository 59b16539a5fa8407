# isplan: two entry points, each doing its own set-up on a fresh machine.
#   make serve  - the dashboard on http://127.0.0.1:8000 (GLM-5.2 preset)
#   make test   - the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: serve test venv bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(BIN)/uvicorn app.main:app --host 127.0.0.1 --port 8000

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
