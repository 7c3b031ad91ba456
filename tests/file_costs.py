#!/usr/bin/env python
"""Seconds each test file took in one pytest run, from its ``--junitxml`` report: the table
``FILE_COSTS`` of tests/conftest.py that orders the files for scripts/test.sh's workers.

Usage::

    bash scripts/test.sh --junitxml /tmp/junit.xml     # on free cores
    python tests/file_costs.py /tmp/junit.xml [--min-seconds 20]

Prints the files of at least ``--min-seconds`` (setup + call + teardown of every test of the file,
as the report's ``time`` counts them), costliest first, as Python dict entries to paste into
``FILE_COSTS``, then the run's total and the longest-first makespan on 2 workers.
Exit status 2 (with a message) for a file that is not a pytest JUnit XML report.
"""

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def file_costs(path):
    """``{"tests/test_x.py": seconds}`` of the pytest JUnit XML report at ``path``.

    Raises ``ValueError`` when the file holds no ``<testcase>`` with a ``classname`` and ``time``."""
    costs = defaultdict(float)
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, t = case.get("classname"), case.get("time")
        if not cls or t is None:
            continue
        # classname: tests.test_x or tests.test_x.TestClass; the file is its first two parts
        parts = cls.split(".")
        costs["/".join(parts[:2]) + ".py"] += float(t)
    if not costs:
        raise ValueError(f"{path}: no <testcase classname=... time=...>: not a pytest --junitxml report")
    return dict(costs)


def makespan(costs, workers=2):
    """Wall seconds of running whole files on ``workers`` workers, longest first (each next file to
    the worker that frees first)."""
    loads = [0.0] * workers
    for c in sorted(costs.values(), reverse=True):
        loads[loads.index(min(loads))] += c
    return max(loads)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("junit_xml", help="a pytest --junitxml report")
    p.add_argument("--min-seconds", type=float, default=20.0, help="leave out files cheaper than this (default 20)")
    a = p.parse_args(argv)
    try:
        costs = file_costs(a.junit_xml)
    except (OSError, ET.ParseError, ValueError) as e:
        print(f"file_costs: {e}", file=sys.stderr)
        return 2
    for name, c in sorted(costs.items(), key=lambda kv: -kv[1]):
        if c >= a.min_seconds:
            print(f'    "{name}": {c:.0f},')
    total = sum(costs.values())
    print(f"# {len(costs)} files, {total:.0f} s in all; longest first on 2 workers: {makespan(costs):.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
