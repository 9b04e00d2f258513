"""The torch tests run under mpirun like tests/mpi (a failing rank aborts the job), in the
venv that has torch (`make test-torch` builds .venv-torch); without torch they are skipped."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed in this venv: `make test-torch` builds .venv-torch "
                                    "with it and runs these tests there")

from mpi.conftest import comm, pytest_configure, pytest_runtest_logreport, rng  # noqa: E402,F401
