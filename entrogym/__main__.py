"""``python -m entrogym ...`` (and ``torchrun -m entrogym train ...``): the same as ``entrogym``."""

import sys

from entrogym.cli import main

if __name__ == "__main__":
    sys.exit(main())
