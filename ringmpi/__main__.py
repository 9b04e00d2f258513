"""`python -m ringmpi ...` is the `ringmpi` command (`ringmpi.tools.cli`)."""
import sys

from .tools.cli import main

sys.exit(main())
