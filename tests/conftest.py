import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
# subprocesses (the CLIs, scripts/*, python -m mt_pipeline.*) import this checkout's packages too,
# not whatever copy is installed in the environment
os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")


import pytest  # noqa: E402


@pytest.fixture
def interp(monkeypatch):
    """Run Triton kernels on CPU tensors under the interpreter (``TRITON_INTERPRET=1``)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
