"""The order scripts/test.sh's workers take the test files in (tests/conftest.py: FILE_COSTS), and
tests/file_costs.py, which measures it from a --junitxml report."""

import os
import subprocess
import sys

import conftest

ROOT = conftest.ROOT


def test_every_costed_file_exists_and_collection_puts_the_costliest_first():
    """A renamed or removed file in FILE_COSTS would silently lose its place; pytest's collection
    (in a subprocess, the same hook) lists the costed files costliest first, then the others."""
    missing = [f for f in conftest.FILE_COSTS if not os.path.isfile(os.path.join(ROOT, f))]
    assert missing == []
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600).stdout
    files = []
    for line in out.splitlines():
        if "::" in line and line.split("::")[0] not in files:
            files.append(line.split("::")[0])
    costed = sorted(conftest.FILE_COSTS, key=lambda f: -conftest.FILE_COSTS[f])
    assert files[:len(costed)] == costed
    assert set(files[len(costed):]).isdisjoint(costed) and len(files) > len(costed)


def test_file_costs_sums_a_junit_report_per_file(tmp_path):
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("file_costs", os.path.join(ROOT, "tests", "file_costs.py"))
    tfc = module_from_spec(spec)
    spec.loader.exec_module(tfc)
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_a" name="t1" time="3.5"/>'
                   '<testcase classname="tests.test_a.TestK" name="t2" time="1.5"/>'
                   '<testcase classname="tests.test_b" name="t3" time="2.0"/>'
                   '<testcase classname="tests.test_c" name="t4" time="2.5"/>'
                   '</testsuite></testsuites>')
    assert tfc.file_costs(str(xml)) == {"tests/test_a.py": 5.0, "tests/test_b.py": 2.0, "tests/test_c.py": 2.5}
    assert tfc.makespan({"a": 5.0, "b": 2.0, "c": 2.5}) == 5.0  # a | c + b
    assert tfc.makespan({"a": 3, "b": 3, "c": 2, "d": 2, "e": 2}) == 7  # longest first: a + c + e | b + d
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "file_costs.py"), str(xml),
                        "--min-seconds", "2.2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[:2] == ['    "tests/test_a.py": 5,', '    "tests/test_c.py": 2,']
    (tmp_path / "bad.xml").write_text("<testsuites/>")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "file_costs.py"), str(tmp_path / "bad.xml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a pytest --junitxml report" in r.stderr
