"""Console entry point ``reproduce``: runs ``scripts/reproduce`` of this checkout (the table
runner lives with the other scripts; this shim only locates it).  See ``scripts/reproduce --help``."""

import os
import runpy
import sys


def main():
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "reproduce")
    if not os.path.exists(script):
        raise SystemExit(f"scripts/reproduce not found next to the package ({script}); "
                         "the entry point needs an editable install (pip install -e .)")
    sys.argv[0] = "reproduce"
    runpy.run_path(script, run_name="__main__")
