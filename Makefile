# The two commands: `make lab` (set up, then start JupyterLab) and `make test` (set up, then run every test).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
BROWSER_STAMP := $(VENV)/.browser-stamp
LAB_PORT ?= 8888

COMPAT_VENV ?= .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.installed-stamp
COMPAT_TORCH := constraints/torch-2.7.txt

# pip installs without compiling bytecode (--no-compile, below: compiling all 190 MB of the venv's Python
# takes about 35 s, and most of it is never imported). Each module is compiled when it is first imported
# and its .pyc written then. That needs writing allowed: with PYTHONDONTWRITEBYTECODE, which containers
# often set, every process would compile torch again (4 CPU-seconds each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv lab test test-fast test-shapes test-deeper test-verdicts reruns test-compat test-browser test-slurm browser-deps slurm-deps mutants notebooks notebook-times process-costs bench lint gpu-check clean

# Rebuilt when pyproject.toml changes, so `make test` always runs against the declared dependencies.
# $(1): the venv's folder; $(2): extra pip arguments (a constraints file)
define make_venv
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' || \
		{ echo "Python 3.11 or newer is needed (found $$($(PYTHON) --version)); set PYTHON=..."; exit 1; }
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet --no-compile $(2) -e '.[lab,test]'
	@# Compile once what every test, rank and kernel imports, before many processes import it at once and each
	@# compiles torch for itself (about 10 CPU-seconds each): two processes, torch's side and the kernel's.
	$(1)/bin/python -c 'import torch._dynamo, torch.distributed.run, torch.distributed.checkpoint, torchvision' & \
		$(1)/bin/python -c 'import pandas, matplotlib.pyplot, papermill, ipykernel.kernelapp, psutil' && \
		wait $$!
	@touch $(1)/.installed-stamp
endef

# $(1): the venv's python; $(2): a name for the report; $(3): pytest's arguments.
# pytest's exit 5 (no tests ran) is a failure.
define run_pytest
	@start=$$(date +%s); \
	$(1) -c 'from importlib.metadata import version as v; print("$(2): torch", v("torch"), "torchvision", v("torchvision"))'; \
	$(1) -m pytest $(3); status=$$?; \
	echo "$(2): $$(( $$(date +%s) - start ))s, pytest exit $$status"; \
	if [ $$status -eq 5 ]; then echo "pytest ran no test: that is a failure"; exit 1; fi; \
	exit $$status
endef

$(STAMP): pyproject.toml
	$(call make_venv,$(VENV),)

# A second venv with the container guide's torch 2.7.1 and torchvision 0.22.1.
$(COMPAT_STAMP): pyproject.toml $(COMPAT_TORCH)
	$(call make_venv,$(COMPAT_VENV),--constraint $(COMPAT_TORCH))

venv: $(STAMP)

lab: venv
	PATH="$(abspath $(VENV))/bin:$$PATH" LAB_PORT=$(LAB_PORT) bash scripts/lab.sh

# --dist loadgroup: a test module marked xdist_group (one whose module-scoped fixture starts a job) runs on
# one xdist worker, so that job starts once; every other test goes to whichever worker is free.
# Three workers on two cores: many tests spend their time waiting (a hang's timeout, a grace period, a
# rendezvous), and a third worker fills that time. In fresh clones on 2 cores, pytest took 776 s with -n 2,
# and 565 to 686 s with -n 3, which kept both cores busy; on 2026-12-04, with -n 3, 431 to 547 s (the
# machine's speed varied by the hour: `import torch` took about 2.3 and 3.6 CPU-seconds).
TEST_WORKERS ?= 3
test: venv
	$(call run_pytest,$(PY),make test,-n $(TEST_WORKERS) --dist loadgroup)

# The tests that start no process (tests/conftest.py skips a test when it would start one), for a quick
# check while changing code: under a minute with a warm venv. make test stays the full run.
test-fast: export DDP_TEST_FAST = 1
test-fast: venv
	$(call run_pytest,$(PY),make test-fast,-n $(TEST_WORKERS) -q -r fE -m "not notebooks and not browser and not slurm and not heavy")

# The notebooks on a machine shape a CPU can stand in for: nproc=1 (a one-GPU box), in smoke mode, and the
# multi-node notebook at full size. The odd world (nproc=3) runs in test-compat, so no stage repeats a shape.
test-shapes: export DDP_TEST_SHAPES = 1
test-shapes: venv
	$(call run_pytest,$(PY),make test-shapes,-n $(TEST_WORKERS) --dist loadgroup tests/test_notebooks.py -k "nproc or full_size")

# The lessons' companion notebooks (notebooks/deeper/: internals, version details, GPU-only reference), in
# smoke mode. A stage of its own, so that make test stays under 10 minutes on 2 cores.
test-deeper: export DDP_TEST_DEEPER = 1
test-deeper: venv
	$(call run_pytest,$(PY),make test-deeper,-n $(TEST_WORKERS) --dist loadgroup tests/test_notebooks.py -k companion)

# Every wrong version of the capstone through its checker (each is three torchrun launches or more): make
# test runs the ones in CI's mutant subset. A stage of its own, so that make test stays under 10 minutes.
test-verdicts: export DDP_TEST_VERDICTS = 1
test-verdicts: venv
	$(call run_pytest,$(PY),make test-verdicts,-n $(TEST_WORKERS) tests/chapters/ch10_capstone/test_capstone.py -k "wrong_version or gradscaler")

# Every test against the oldest supported torch (the container's); the notebooks there run at nproc=3.
test-compat: export DDP_TEST_NPROC = 3
test-compat: $(COMPAT_STAMP)
	$(call run_pytest,$(COMPAT_PY),make test-compat,-n $(TEST_WORKERS) --dist loadgroup)

# Playwright in the venv, installed once (a stamp, as for the venv): so that `make test-browser` reinstalls
# nothing under a stage that runs beside it from the same venv (.ci/run runs test-slurm beside it).
$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-compile -e '.[lab,test,browser]'
	@touch $@

# What the browser and SLURM stages install: apt takes one install at a time, so these come first.
browser-deps: $(BROWSER_STAMP)
	bash scripts/install_chromium.sh

slurm-deps: venv
	bash scripts/install_slurm.sh

# JupyterLab in a real browser: Debian's Chromium (apt, when missing and possible) driven by Playwright.
test-browser: browser-deps
	$(call run_pytest,$(PY),make test-browser (screenshots in runs/screenshots/),-m browser)

# The generated sbatch file on a real SLURM: Debian's slurm-wlm and munge (apt, when missing and possible),
# munged, slurmctld and two slurmd started on this machine by the test, and stopped after it.
test-slurm: slurm-deps
	$(call run_pytest,$(PY),make test-slurm,-m slurm tests/chapters/ch06_scaling_out/test_slurm.py)

# Each catalogued DDP bug (each chapter's ddp_helpers/chapters/chNN_*/chNN_mutants.toml) put into a throwaway copy of the project, and the notebook that
# teaches its lesson run on it in smoke mode: every one must fail that notebook. ARGS: e.g. --only 03 --jobs 1.
mutants: venv
	$(PY) mutants/run.py --jobs 2 $(ARGS)

# Each notebook run three times in one folder, as a learner reruns it with other parameters: smoke at
# nproc 2, full size, smoke at nproc 3 (ARGS='--sequence smoke:2,smoke:3 08' for fewer). Long: full size.
reruns: venv
	$(PY) benchmarks/notebook_reruns.py $(ARGS)

# Every notebook at full size (smoke=False), outputs kept under runs/executed/.
notebooks: venv
	@mkdir -p runs/executed
	@for nb in notebooks/[0-9][0-9]_*.ipynb; do \
		echo "== $$nb"; \
		DDP_HELPERS_PROGRESS=text $(PY) -m papermill "$$nb" "runs/executed/$$(basename $$nb)" -p solutions True \
			--cwd runs/executed -k python3 || exit 1; \
	done

# A learner's wait: each notebook's wall time in smoke mode, and its slowest cells (ARGS=--full: full size).
notebook-times: venv
	$(PY) benchmarks/notebook_times.py $(ARGS)

# Where make test's CPU goes: each Python process's CPU-seconds, by kind (ranks, agents, kernels) and by test.
process-costs: venv
	$(PY) benchmarks/process_costs.py $(ARGS) -- $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -q

bench: venv
	$(PY) benchmarks/bench_launch.py
	$(PY) benchmarks/bench_training.py
	$(PY) benchmarks/bench_live_ranks.py

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy  # pyproject.toml's files: the package, tests, scripts, benchmarks, mutants

# For a GPU machine with torch but no venv and no internet: uses the venv only if there is one. Runs the
# doctor, every notebook (smoke, then full size) and ResNet-50 training within GPU_CHECK_DEADLINE_S seconds.
# Without a venv, papermill comes from wheels in .whl/ (fetch them where there is internet: scripts/gpu_wheels.sh).
GPU_PY := $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_DEADLINE_S ?= 420
GPU_CHECK_ARGS ?=
gpu-check:
	@if [ ! -x "$(PY)" ] && ls .whl/*.whl >/dev/null 2>&1; then \
		python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
			--target /tmp/gpu-check-site .whl/*.whl; fi
	PYTHONPATH="$(CURDIR)$$([ -d /tmp/gpu-check-site ] && echo :/tmp/gpu-check-site)$${PYTHONPATH:+:$$PYTHONPATH}" \
		$(GPU_PY) scripts/gpu_check.py --deadline-s $(GPU_CHECK_DEADLINE_S) $(GPU_CHECK_ARGS)

clean:
	rm -rf runs notebooks/runs .pytest_cache $(COMPAT_VENV)
