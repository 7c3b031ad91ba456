#!/usr/bin/env python
"""ReLA Table 1 (rows 1-13) on Multi30k En->De: ``scripts/run_table.py`` with
``configs/rela/table1.yaml`` (kept as the short command the README and results name).

Usage:
    python scripts/rela_table1.py [--rows 1,7,13] [--max-rows K] [--render-only]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_table  # noqa: E402

if __name__ == "__main__":
    run_table.main(default_table="configs/rela/table1.yaml")
