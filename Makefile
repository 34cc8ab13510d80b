PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo bench torture clean lint compat compat-smoke

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The PostgreSQL tests (marked postgres) start a throwaway server when its binaries are
# here (`python -m fixtures.postgres_server install` puts them there), and are skipped
# with the reason when they are not.
#
# The suite runs in PYTEST_JOBS processes (pytest-xdist), two per core: it waits on
# processes and sockets more than it computes (in one process it keeps half a core
# busy). A whole file goes to one process (--dist loadfile), so that a module's
# app-server and scripted model start once; each process starts its own PostgreSQL
# server and builds its own wheel. PYTEST_JOBS=0 runs the suite in one process.
# The usage parity tests (marked ccusage) fetch the pinned ccusage from npm on first use
# into $(COMPAT_CACHE)/npm/ccusage-VERSION (`python -m fixtures.ccusage_npm`).
PYTEST_JOBS ?= $(shell echo $$(( $$(nproc) * 2 )))
test: $(STAMP)
	$(PY) -m pytest -m 'not slow' -rs -n $(PYTEST_JOBS) --dist loadfile $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m fixtures.demo

bench: $(STAMP)
	$(PY) -m bench.run $(if $(BENCH_JSON),--json $(BENCH_JSON),)

# Fault injection at full counts (real app-server, real SIGKILLs): the whole crash-point
# matrix, random kills, rollover races and server faults, then 200 random-kill rounds and
# 60 rollover races with the summary table (seed printed; replay with --seed). Then several
# daemons on one PostgreSQL ledger: one stopped past its lease at every checkpoint, with two
# and three daemons, LEASE_ROUNDS times (each round: 10 cases of about 12 s on 2 cores).
# In all about 75 minutes: the matrix 8, the rounds and races 25, the leases 40.
TORTURE_ROUNDS ?= 200
TORTURE_RACES ?= 60
LEASE_ROUNDS ?= 20
torture: $(STAMP)
	$(PY) -m pytest -m slow tests/faults $(PYTEST_ARGS)
	TILLERMAN_LEASE_ROUNDS=$(LEASE_ROUNDS) $(PY) -m pytest -m slow tests/live/test_postgres_leases_live.py $(PYTEST_ARGS)
	$(PY) -m tests.faults.torture --rounds $(TORTURE_ROUNDS) --races $(TORTURE_RACES) $(if $(SEED),--seed $(SEED),)

# Supported Codex releases: the oldest and the newest. `make compat` runs the live tests
# against each, on the binary users install (npm @openai/codex), fetched the first time
# into $(COMPAT_CACHE)/npm/VERSION/codex by `python -m fixtures.codex_npm VERSION`;
# `make compat CODEX_NEWEST=0.172.0` checks a new release. `make compat-smoke` (CI) runs
# the refusal and --spawn-codex checks against the oldest. tests/test_compat.py keeps
# these equal to the ends of controller/core/rpc_errors.py CHECKED_CODEX_VERSIONS.
CODEX_OLDEST := 0.153.4
CODEX_NEWEST := 0.171.0
COMPAT_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tillerman/compat
COMPAT_SMOKE := tests/live/test_rpc_errors_live.py tests/live/test_spawn_codex_live.py
# the binary of release $(1), fetched when absent; a failed fetch ends the recipe
fetch_codex = binary=$$(COMPAT_CACHE=$(COMPAT_CACHE) $(PY) -m fixtures.codex_npm $(1)) || exit 1

compat: $(STAMP)
	@for version in $(CODEX_OLDEST) $(CODEX_NEWEST); do \
		$(call fetch_codex,$$version); \
		echo "== Codex $$version ($$binary)"; \
		TILLERMAN_CODEX_BIN=$$binary $(PY) -m pytest -m 'live and not slow' tests/live $(PYTEST_ARGS) || exit 1; \
	done

compat-smoke: $(STAMP)
	@$(call fetch_codex,$(CODEX_OLDEST)); \
		TILLERMAN_CODEX_BIN=$$binary $(PY) -m pytest -m live $(COMPAT_SMOKE) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

lint: $(STAMP)
	$(PY) -m ruff check tillerman ledger rules monitor controller fixtures tests bench
