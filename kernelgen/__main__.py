"""``python -m kernelgen``: the command line (``kernelgen.cli``)."""
import sys

from kernelgen.cli import main

sys.exit(main())
