"""`python -m rtx_backend info | clear-cache` (see tools/info.py)."""

from __future__ import annotations

import sys

from .tools.info import main

if __name__ == "__main__":
    sys.exit(main())
