"""The MPI transport implements the whole transport interface (`Group`, which includes
what schedules use, `Transport`), with the same parameters."""
from __future__ import annotations

import sys
from pathlib import Path

from ringmpi.mpicomm import MPITransport, transport
from ringmpi.transport import Group, Transport

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_layers import assert_implements  # noqa: E402


def test_mpi_transport_implements_the_protocols():
    assert_implements(MPITransport, Transport)
    assert_implements(MPITransport, Group)
    assert isinstance(transport(), Group)
