"""`python -m benchmarks.tables [--check]`: see pages.py."""

import sys

from benchmarks.tables.pages import main

sys.exit(main())
