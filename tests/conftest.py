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


#: The test files that take minutes, slowest first (serial seconds measured on 2026-11-29 with
#: ``--durations=0``: campaign 531, pipeline_faults 417, triton_attention 358, ...).  scripts/test.sh
#: runs the files on pytest-xdist workers in collection order (``--dist loadfile --no-loadscope-reorder``;
#: xdist's own reorder puts files with many quick tests first and left one worker alone for ~10 minutes
#: on the last slow file): longest first lets the workers finish together.  Only the order changes.
SLOW_FILES_FIRST = (
    "test_campaign.py", "test_pipeline_faults.py", "test_triton_attention.py", "test_dataprep_truecase_bpe.py",
    "test_bad_checkpoints.py", "test_end_to_end.py", "test_dataprep_recipes.py", "test_flexible.py",
    "test_bad_input.py", "test_pipeline.py", "test_hydra.py", "test_kernel_report.py", "test_faults.py",
    "test_safety.py", "test_bench_speed.py", "test_long_documents.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Run :data:`SLOW_FILES_FIRST` first, in that order; every other file after, in collection order
    (a stable sort: the order of the tests inside a file is kept)."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))
