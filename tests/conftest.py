"""Every test run is isolated from the user's machine: no test reads or writes the user's
profile (~/.cache/ringmpi) or depends on RINGMPI_* variables set in the calling shell."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py

for _k in [k for k in os.environ if k.startswith("RINGMPI_")]:
    del os.environ[_k]
_HOME = tempfile.mkdtemp(prefix="ringmpi-test-cache-")
atexit.register(shutil.rmtree, _HOME, True)
os.environ["XDG_CACHE_HOME"] = _HOME
os.environ["RINGMPI_PROFILE"] = os.path.join(_HOME, "no-profile.json")
