import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
# subprocesses (the CLIs, scripts/*, python -m mt_pipeline.*) import this checkout's packages too,
# not whatever copy is installed in the environment
os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
# under pytest-xdist (scripts/test.sh), the workers share the cores: each gets its share of threads, and so
# do the subprocesses it starts (fairseq-train, the CLIs), instead of every process taking them all
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = _threads
    import torch  # noqa: E402

    torch.set_num_threads(int(_threads))

import pytest  # noqa: E402


@pytest.fixture
def interp(monkeypatch):
    """Run Triton kernels on CPU tensors under the interpreter (``TRITON_INTERPRET=1``)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
