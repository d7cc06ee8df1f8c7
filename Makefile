# The two commands: `make lab` (set up, then start JupyterLab) and `make test` (set up, then run every test).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LAB_PORT ?= 8888

.PHONY: venv lab test notebooks bench lint gpu-check clean

# Rebuilt when pyproject.toml changes, so `make test` always runs against the declared dependencies.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || \
		{ echo "Python 3.11 or newer is needed (found $$($(PYTHON) --version)); set PYTHON=..."; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[lab,test]'
	@touch $(STAMP)

venv: $(STAMP)

lab: venv
	PATH="$(abspath $(VENV))/bin:$$PATH" LAB_PORT=$(LAB_PORT) bash scripts/lab.sh

test: venv
	@start=$$(date +%s); \
	$(PY) -m pytest -n 2; status=$$?; \
	echo "make test: $$(( $$(date +%s) - start ))s, pytest exit $$status"; \
	if [ $$status -eq 5 ]; then echo "pytest ran no test: that is a failure"; exit 1; fi; \
	exit $$status

# Every notebook at full size (smoke=False), outputs kept under runs/executed/.
notebooks: venv
	@mkdir -p runs/executed
	@for nb in notebooks/[0-9][0-9]_*.ipynb; do \
		echo "== $$nb"; \
		DDP_HELPERS_PROGRESS=text $(PY) -m papermill "$$nb" "runs/executed/$$(basename $$nb)" \
			--cwd runs/executed -k python3 || exit 1; \
	done

bench: venv
	$(PY) benchmarks/bench_launch.py
	$(PY) benchmarks/bench_training.py

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# For a GPU machine with torch but no venv and no internet: uses the venv only if there is one.
GPU_PY := $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m ddp_helpers.gpu_check

clean:
	rm -rf runs notebooks/runs .pytest_cache
