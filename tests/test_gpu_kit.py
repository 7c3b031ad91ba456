"""The GPU kit's data (:mod:`mt_pipeline.gpu_kit`): the extra files beside the plan's corpora land
under the relative paths the tools read them from, byte for byte, and a missing one is named."""

import filecmp
import glob
import os
import subprocess

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


SHELL_SCRIPTS = sorted(glob.glob(os.path.join(gpu_kit.ROOT, "scripts", "*.sh"))
                       + glob.glob(os.path.join(gpu_kit.ROOT, "data-prep", "*", "*.sh")))


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: os.path.relpath(p, gpu_kit.ROOT))
def test_every_shell_script_parses(script):
    """``bash -n``: the scripts that run only on a lent GPU machine (gpu_window.sh, gpu_campaign.sh,
    device_setup.sh) meet no other syntax check before a window's minutes are spent on them."""
    out = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_gpu_campaign_refuses_bad_input_before_copying_anything(tmp_path):
    """scripts/gpu_campaign.sh: a folder that is not a kit, or SECONDS that is not a number, is
    refused with the reason before the checkout is copied or anything is installed."""
    work = tmp_path / "copy"
    env = dict(os.environ, GPU_CAMPAIGN_DIR=str(work))
    script = os.path.join(gpu_kit.ROOT, "scripts", "gpu_campaign.sh")

    def run(*args):
        return subprocess.run(["bash", script, *args], cwd=gpu_kit.ROOT, env=env, capture_output=True, text=True)

    (tmp_path / "notakit").mkdir()
    out = run(str(tmp_path / "notakit"), str(tmp_path / "out"), "60")
    assert out.returncode == 2 and "is not a GPU kit (no KIT.json)" in out.stderr, out.stderr
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "KIT.json").write_text("{}")
    out = run(str(kit), str(tmp_path / "out"), "ten")
    assert out.returncode == 2 and "SECONDS must be a whole number of seconds, got 'ten'" in out.stderr
    out = run(str(kit))
    assert out.returncode != 0 and "OUT folder" in out.stderr
    assert not work.exists() and not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.isdir(SHARED), reason=f"shared data not found at {SHARED}")
def test_the_kit_carries_what_mt_prep_reads_of_every_smoke_and_converged_corpus(tmp_path):
    """The smoke plan trains on Multi30k and on the long documents (ReLUFormer T6), whose inputs are
    three folders of the shared data: the kit's copy holds each under its own path, and the
    long-document sources read from it are those read from ../shared/data (sha256-checked)."""
    from mt_pipeline import campaign
    from mt_pipeline.prep.longdoc import sources

    plans = [campaign.load_plan(p) for p in ("configs/campaign/smoke.yaml", "configs/campaign/converged.yaml")]
    inputs = gpu_kit.corpus_inputs(plans)
    assert inputs == {"long_documents": list(sources.SHARED_INPUTS), "multi30k": ["multi30k_en_de/raw"]}
    data = tmp_path / "data"
    got = gpu_kit.copy_corpus_data(str(data), inputs, SHARED)
    assert got == sorted(str(data / r) for r in ["multi30k_en_de/raw", *sources.SHARED_INPUTS])
    for rel in ["multi30k_en_de/raw", *sources.SHARED_INPUTS]:
        cmp = filecmp.dircmp(os.path.join(SHARED, rel), data / rel)
        assert not (cmp.left_only or cmp.right_only or cmp.diff_files), rel
    assert sources.load_all(str(data), log=lambda *a: None) == sources.load_all(SHARED, log=lambda *a: None)


def test_missing_corpus_files_are_named_before_anything_is_copied(tmp_path):
    inputs = {"long_documents": ["docmt_maruf2019_en_de", "wmt/sgm"], "x": []}
    (tmp_path / "shared" / "wmt" / "sgm").mkdir(parents=True)
    with pytest.raises(SystemExit) as err:
        gpu_kit.copy_corpus_data(str(tmp_path / "data"), inputs, str(tmp_path / "shared"))
    assert "docmt_maruf2019_en_de (corpus long_documents)" in str(err.value)
    assert "x: its spec names no local folder" in str(err.value) and "wmt/sgm" not in str(err.value)
    assert not (tmp_path / "data").exists()
