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

# Fault injection at full counts (real app-server, real SIGKILLs): the whole crash-point
# matrix, random kills, rollover races and server faults, then 200 random-kill rounds and
# 60 rollover races with the summary table (seed printed; replay with --seed).
TORTURE_ROUNDS ?= 200
TORTURE_RACES ?= 60
torture: $(STAMP)
	$(PY) -m pytest -m slow tests/faults $(PYTEST_ARGS)
	$(PY) -m tests.faults.torture --rounds $(TORTURE_ROUNDS) --races $(TORTURE_RACES) $(if $(SEED),--seed $(SEED),)

clean:
	rm -rf $(VENV) build *.egg-info

lint: $(STAMP)
	$(PY) -m ruff check ledger rules monitor controller fixtures tests bench
