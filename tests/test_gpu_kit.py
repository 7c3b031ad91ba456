"""The GPU kit's data (:mod:`mt_pipeline.gpu_kit`): the extra files beside the plan's corpora land
under the relative paths the tools read them from, byte for byte, and a missing one is named."""

import filecmp
import os

import pytest

from mt_pipeline import gpu_kit

SHARED = os.path.join(os.path.dirname(gpu_kit.ROOT), "shared", "data")


@pytest.mark.skipif(not all(os.path.isfile(os.path.join(SHARED, r)) for r in gpu_kit.EXTRA_DATA),
                    reason=f"shared data not found at {SHARED}")
def test_extra_data_is_copied_under_its_relative_path(tmp_path):
    got = gpu_kit.copy_extra_data(str(tmp_path / "data"))
    assert got == [str(tmp_path / "data" / r) for r in gpu_kit.EXTRA_DATA]
    for rel, path in zip(gpu_kit.EXTRA_DATA, got):
        assert filecmp.cmp(os.path.join(SHARED, rel), path, shallow=False)


def test_a_missing_extra_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="wmt/plain/newstest2014.de-en.en.gz not found under"):
        gpu_kit.copy_extra_data(str(tmp_path / "data"), shared_data=str(tmp_path / "nowhere"))
    assert not (tmp_path / "data").exists()
