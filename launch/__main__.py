"""`mpiexec -n W python -m nvlink_emu.launch SCRIPT.py [options] [-- ARGS]`: run a workload script on the fabric."""

import sys

from .runner import main

sys.exit(main())
