# Every target builds what it needs from scratch: a fresh clone runs `make run` or `make test` directly.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
CONSTRAINTS := constraints/cpu.txt
# The constraints also reach pip's isolated build environment through PIP_CONSTRAINT.
PIP_ENV := PIP_CONSTRAINT=$(abspath $(CONSTRAINTS)) PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: install run test test-reproducibility lint bench bench-env clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_ENV) $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev,tune,export]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dynaforge run configs/quickstart.yaml --out runs/quickstart

test: $(STAMP)
	$(PY) -m pytest -q

# The reproducibility tests again with 1 and with 2 torch threads (CI runs this after `make test`).
test-reproducibility: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m reproducibility
	OMP_NUM_THREADS=2 $(PY) -m pytest -q -m reproducibility

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

# Peers used only as baselines (exponax, neuraloperator) live in their own environment.
bench-env: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml $(CONSTRAINTS) constraints/bench.txt benchmarks/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(PIP_ENV) $(BENCH_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -c constraints/bench.txt -e '.[tune,export]'
	$(PIP_ENV) $(BENCH_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -c constraints/bench.txt -r benchmarks/requirements.txt
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	@for script in benchmarks/*.py; do \
		[ "$$script" = benchmarks/machine.py ] && continue; \
		echo "== $$script"; \
		$(BENCH_VENV)/bin/python $$script || exit 1; \
	done

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .ruff_cache
