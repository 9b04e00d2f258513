"""`python -m ringmpi.launch -n 4 -- CMD`: start an MPI job (see `ringmpi.tools.launch`)."""
import sys

from .tools.launch import main

if __name__ == "__main__":
    sys.exit(main())
