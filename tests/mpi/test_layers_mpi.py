"""The MPI transport implements the whole transport interface (`Group`, which includes
what schedules use, `Transport`), with the same parameters."""
from __future__ import annotations

import sys
from pathlib import Path

from ringmpi.device import DeviceGroup
from ringmpi.mpicomm import MPITransport, RequestView, transport
from ringmpi.shm import SharedTransport
from ringmpi.transport import Group, SubGroup, Transport

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))
from test_layers import assert_implements  # noqa: E402


def test_every_transport_implements_the_protocols():
    """Every transport a schedule body may be handed: the MPI one (and the whole `Group`),
    a request's suspending one, the shared-memory one, a sub-group of a hierarchical
    schedule, and the device one."""
    assert_implements(MPITransport, Transport)
    assert_implements(MPITransport, Group)
    for cls in (RequestView, SharedTransport, SubGroup, DeviceGroup):
        assert_implements(cls, Transport)
    t = transport()
    assert isinstance(t, Group)
    assert isinstance(t.request_view("allreduce/ring"), Transport)
