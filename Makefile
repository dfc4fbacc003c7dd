# Every target builds what it needs from scratch: a fresh clone runs `make run` or `make test` directly.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
APE_VENV := .venv-apebench
APE_STAMP := $(APE_VENV)/.installed
CONSTRAINTS := constraints/cpu.txt
# The constraints also reach pip's isolated build environment through PIP_CONSTRAINT.
PIP_ENV := PIP_CONSTRAINT=$(abspath $(CONSTRAINTS)) PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: install run test test-reproducibility lint docs bench bench-env bench-env-apebench bench-check bench-smoke clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_ENV) $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev,tune,export]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dynaforge run configs/quickstart.yaml --out runs/quickstart

# The tests and the notebooks, each notebook run top to bottom in a kernel of .venv (nbmake).
test: $(STAMP)
	$(PY) -m pytest -q --nbmake tests notebooks

# JupyterLab from .venv on the quickstart notebook. The environment is also registered as the Jupyter kernel
# `dynaforge` for this user (`jupyter kernelspec list` shows where), so that another front end (VS Code, a
# JupyterLab installed elsewhere) can run notebooks with it; `jupyter kernelspec remove dynaforge` undoes that.
# NOTEBOOK_ARGS: more options for `jupyter lab`, e.g. NOTEBOOK_ARGS="--no-browser --port 8889"; as root (a
# container) Jupyter asks for --allow-root.
NOTEBOOK_STAMP := $(VENV)/.notebook-installed
NOTEBOOK_ARGS ?=

.PHONY: notebook
notebook: $(NOTEBOOK_STAMP)
	$(PY) -m ipykernel install --user --name dynaforge --display-name "Python (dynaforge .venv)"
	$(VENV)/bin/jupyter lab $(NOTEBOOK_ARGS) notebooks/quickstart.ipynb

$(NOTEBOOK_STAMP): $(STAMP)
	$(PIP_ENV) $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[dev,tune,export,notebook]'
	touch $(NOTEBOOK_STAMP)

# The reproducibility tests again with 1 and with 2 torch threads (CI runs this after `make test`, only at
# the counts that `make test` did not already use: REPRO_THREADS="1").
REPRO_THREADS ?= 1 2
test-reproducibility: $(STAMP)
	for threads in $(REPRO_THREADS); do OMP_NUM_THREADS=$$threads $(PY) -m pytest -q -m reproducibility || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

# The API reference, built by pdoc from the docstrings into site/ (git-ignored): the notebook API
# `dynaforge.api` first, then every package and top-level module of dynaforge, a package showing the names
# of its `__all__`. `dynaforge` itself is left out: pdoc cannot follow its lazy re-exports of
# `dynaforge.api` (module `__getattr__`), which have their own page. pdoc is silent when clean, so any output
# fails the build: warnings are errors. One is ignored: pdoc cannot resolve the postponed field annotations
# of a NamedTuple's `__init__` (mitmproxy/pdoc#765; the fields show them as written). PDOC_ALLOW_EXEC:
# importing h5py runs `uname -p`, which pdoc would otherwise block with a warning. PDOC_DISPLAY_ENV_VARS:
# without it pdoc warns when a default value equals an environment variable's, so the build would depend
# on the machine. Our docstrings are Markdown, which reads the same in the restructuredtext docformat; that
# docformat also renders the reST directives of docstrings inherited from torch (`.. note::`) and checks
# `.. include::`.
DOCS_DIR := site
DOCS_PACKAGES = $(subst /,.,$(patsubst src/%/__init__.py,%,$(wildcard src/dynaforge/*/__init__.py)))
DOCS_TOP_MODULES = $(subst /,.,$(patsubst src/%.py,%,$(filter-out src/dynaforge/__init__.py \
	src/dynaforge/api.py,$(wildcard src/dynaforge/*.py))))
DOCS_IGNORED := 'ignore:Error parsing type annotation ForwardRef('

docs: $(STAMP)
	rm -rf $(DOCS_DIR)
	@log=$$(PDOC_ALLOW_EXEC=1 PDOC_DISPLAY_ENV_VARS=1 $(PY) -W $(DOCS_IGNORED) -m pdoc \
		--docformat restructuredtext --output-directory $(DOCS_DIR) \
		dynaforge.api $(DOCS_PACKAGES) $(DOCS_TOP_MODULES) 2>&1) || { echo "$$log"; exit 1; }; \
	if [ -n "$$log" ]; then echo "$$log"; echo "make docs: pdoc warned (warnings are errors)"; exit 1; fi
	@echo "API reference: $(DOCS_DIR)/index.html"

# Peers used only as baselines (exponax, neuraloperator) live in their own environment.
bench-env: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml $(CONSTRAINTS) constraints/bench.txt benchmarks/requirements.txt
	$(PYTHON) -m venv $(BENCH_VENV)
	$(PIP_ENV) $(BENCH_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -c constraints/bench.txt -e '.[tune,export]'
	$(PIP_ENV) $(BENCH_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -c constraints/bench.txt -r benchmarks/requirements.txt
	touch $(BENCH_STAMP)

# APEBench pins exponax 0.1.0 (.venv-bench holds 0.2.0): its own environment, for benchmarks/apebench.py
# (which runs itself there when started from another interpreter).
bench-env-apebench: $(APE_STAMP)

$(APE_STAMP): pyproject.toml $(CONSTRAINTS) constraints/bench-apebench.txt benchmarks/requirements-apebench.txt
	$(PYTHON) -m venv $(APE_VENV)
	$(PIP_ENV) $(APE_VENV)/bin/python -m pip install -q -c $(CONSTRAINTS) -c constraints/bench-apebench.txt -e . -r benchmarks/requirements-apebench.txt
	touch $(APE_STAMP)

# Every benchmark script (benchmarks/smoke.py lists them: benchmarks/*.py but its helper modules) at its
# full size; the figures go to benchmarks/results/.
bench: $(BENCH_STAMP) $(APE_STAMP)
	@for script in $$($(PYTHON) benchmarks/smoke.py --list); do \
		echo "== $$script"; \
		$(BENCH_VENV)/bin/python $$script || exit 1; \
	done

# That every benchmark script has the smoke flag (--quick, documented in its docstring): no environment needed.
bench-check:
	$(PYTHON) benchmarks/smoke.py --check

# Every benchmark script with --quick (tiny sizes, baselines included, outputs to a temporary folder, never
# benchmarks/results/), BENCH_SMOKE_JOBS at a time (most run on one thread), the seconds of each printed.
# CI runs it so that no benchmark rots.
BENCH_SMOKE_JOBS ?= 2
bench-smoke: bench-check $(BENCH_STAMP) $(APE_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/smoke.py --jobs $(BENCH_SMOKE_JOBS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(APE_VENV) .pytest_cache .ruff_cache
