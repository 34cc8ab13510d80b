PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench torture clean lint

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -m 'not slow' $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m fixtures.demo

bench: $(STAMP)
	$(PY) -m bench.run $(if $(BENCH_JSON),--json $(BENCH_JSON),)

clean:
	rm -rf $(VENV) build *.egg-info

lint: $(STAMP)
	$(PY) -m ruff check ledger rules monitor controller fixtures tests bench
