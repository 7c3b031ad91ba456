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


# --- order of the test files, for the two pytest-xdist workers of scripts/test.sh -----------------
# `--dist loadfile` hands each worker whole files in collection order (`--no-loadscope-reorder`;
# xdist's default puts the files with the most tests first, whatever they cost).  The costliest files
# go first, so that the last minutes are not one worker finishing a heavy file while the other idles
# (the longest-first rule).  FILE_COSTS: seconds per file on 2 free cores of the project's AMD EPYC
# (`python tests/file_costs.py JUNIT_XML` prints this table from a run's --junitxml); the
# order is a matter of wall time only, and files not listed run after these in their usual order.
FILE_COSTS = {  # measured 2026-11-30 at db3e6d2 (45 files, 3676 s in all; longest first on 2 workers: 1838 s wall)
    "tests/test_campaign.py": 545,
    "tests/test_triton_attention.py": 540,
    "tests/test_pipeline_faults.py": 349,
    "tests/test_dataprep_truecase_bpe.py": 233,
    "tests/test_dataprep_recipes.py": 229,
    "tests/test_bad_checkpoints.py": 181,
    "tests/test_analysis.py": 175,
    "tests/test_extending.py": 140,  # 2026-12-01 with mt-experiment --user-dir (one worker, beside a niced training run)
    "tests/test_end_to_end.py": 134,
    "tests/test_flexible.py": 130,
    "tests/test_pipeline.py": 126,
    "tests/test_bad_input.py": 117,
    "tests/test_kernel_report.py": 109,
    "tests/test_bench_speed.py": 74,
    "tests/test_faults.py": 70,
    "tests/test_long_documents.py": 68,
    "tests/test_row_terms_fused.py": 67,
    "tests/test_hydra.py": 66,
    "tests/test_safety.py": 64,
    "tests/test_bench_prep.py": 54,
    "tests/test_eatt.py": 51,
    "tests/test_prep_pipeline.py": 40,
    "tests/test_distributed.py": 30,
    "tests/test_bench_decode_length.py": 27,
    "tests/test_relu_kernel.py": 25,
    "tests/test_checkpoint.py": 24,
    "tests/test_analysis_word_level.py": 22,
    "tests/test_prep_streaming.py": 20,
    "tests/test_attention_seam.py": 16,
}


def pytest_collection_modifyitems(session, config, items):
    """Sort the collected tests by :data:`FILE_COSTS`, costliest file first (a stable sort: the
    tests of a file keep their order, and unlisted files theirs)."""
    rel = {}

    def cost(item):
        path = str(item.path)
        if path not in rel:
            rel[path] = os.path.relpath(path, ROOT).replace(os.sep, "/")
        return -FILE_COSTS.get(rel[path], 0.0)

    items.sort(key=cost)
