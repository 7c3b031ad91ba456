"""The machinery every data-prep pipeline shares (mt_pipeline.prep): the one download/checksum
path, the stage runner (stamps, atomic stage directories, dry runs), the removal of what a killed
run left, and the ``mt-prep`` command line.
"""

import gzip
import os
import shutil
import subprocess
import sys

import pytest

from mt_pipeline.prep import cli, fetch
from mt_pipeline.prep.run import INCOMPLETE, PrepRun, StopAfter, remove_run_leftovers
from mt_pipeline.provenance import file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
M30K_RAW = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "multi30k_en_de", "raw"))
ENV = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def prepare(corpus, *args, env=None):
    return subprocess.run(["bash", os.path.join(ROOT, "data-prep", corpus, "prepare.sh"), *args],
                          env=env or ENV, capture_output=True, text=True, timeout=600)


# ---------------------------------------------------------------------------------------------
# fetch: one download path, checksums
# ---------------------------------------------------------------------------------------------
def test_download_keeps_a_file_only_with_its_checksum(tmp_path):
    src = tmp_path / "upstream" / "train.en.gz"
    src.parent.mkdir()
    src.write_bytes(gzip.compress(b"a man .\n"))
    url, dest = src.as_uri(), tmp_path / "download" / "train.en.gz"
    good = file_sha256(str(src))
    with pytest.raises(fetch.ChecksumError, match=f"sha256 mismatch for {url}: expected {'0' * 64}, got {good}"):
        fetch.download(url, str(dest), "sha256", "0" * 64)
    assert os.listdir(dest.parent) == []  # neither the file nor a temp file
    with pytest.raises(fetch.FetchError, match="download failed"):
        fetch.download((tmp_path / "upstream" / "absent.gz").as_uri(), str(dest), retries=1)
    assert os.listdir(dest.parent) == []
    assert fetch.download(url, str(dest), "sha256", good) == good
    assert dest.read_bytes() == src.read_bytes()
    assert fetch.download(url, str(dest), "md5") == file_sha256(str(src), "md5")  # unverified: any digest


def test_fetch_all_records_unverified_checksums_and_skips_good_files(tmp_path, capsys):
    src = tmp_path / "up" / "a.dat"  # not an archive: fetch.check_complete has nothing to read through
    src.parent.mkdir()
    src.write_bytes(b"archive")
    run = PrepRun("t", str(tmp_path / "out"))
    items = [{"url": src.as_uri(), "file": "a.dat", "sha256": "unverified"}]
    ddir = tmp_path / "out" / "download"
    fetch.fetch_all(run, items, str(ddir))
    assert (ddir / "CHECKSUMS").read_text() == f"{file_sha256(str(src))} a.dat\n"
    fetch.fetch_all(run, items, str(ddir))  # present with the stored checksum: not fetched again
    assert "have download/a.dat" in capsys.readouterr().out
    src.write_bytes(b"another archive")  # upstream changed: the stored checksum refuses it
    (ddir / "a.dat").unlink()
    with pytest.raises(SystemExit):
        fetch.fetch_all(run, items, str(ddir))
    assert "sha256 mismatch" in capsys.readouterr().err and not (ddir / "a.dat").exists()


@pytest.mark.skipif(not os.path.isdir(M30K_RAW), reason=f"real data not found at {M30K_RAW}")
def test_multi30k_download_mode_refuses_a_tampered_mirror_file(tmp_path):
    """Download mode from a mirror (MULTI30K_BASE_URL) holding one altered file: the run stops
    naming it, keeps the good files fetched before it and writes neither the bad file nor raw/;
    with the mirror repaired only the missing files are fetched and the corpus is prepared."""
    mirror, out = tmp_path / "mirror", tmp_path / "out"
    shutil.copytree(M30K_RAW, mirror)
    bad = mirror / "val.de.gz"
    bad.write_bytes(gzip.compress(gzip.decompress(bad.read_bytes()).replace(b"Ein ", b"Eine ", 1)))
    env = dict(ENV, MULTI30K_BASE_URL=mirror.as_uri())
    args = ("--download", "--out", str(out), "--train-lines", "300", "--bpe-merges", "100", "--workers", "1")
    r = prepare("multi30k", *args, env=env)
    assert r.returncode != 0 and "sha256 mismatch" in r.stderr and "val.de.gz" in r.stderr
    assert sorted(os.listdir(out / "download")) == ["train.de.gz", "train.en.gz", "val.en.gz"]  # (spec order)
    assert not (out / "raw").exists()
    shutil.copy(os.path.join(M30K_RAW, "val.de.gz"), bad)
    r = prepare("multi30k", *args, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("(sha256 ok)") == 3 and r.stdout.count("] download file://") == 5
    assert (out / "download" / "val.de.gz").read_bytes() == (mirror / "val.de.gz").read_bytes()
    assert r.stdout.splitlines()[-1] == str(out / "bin") and (out / "bin" / "test1.en-de.de.idx").exists()


# ---------------------------------------------------------------------------------------------
# the stage runner
# ---------------------------------------------------------------------------------------------
def _writer(calls, name="a.txt", text="x\n"):
    def body(d):
        calls.append(d)
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    return body


def test_stage_reruns_when_its_stamp_or_an_output_changes(tmp_path, capsys):
    run, d, calls = PrepRun("t", str(tmp_path)), str(tmp_path / "tok"), []
    files = [os.path.join(d, "a.txt")]
    assert run.stage("tok", d, "stage=tok\nmerges=1", files, _writer(calls)) is True
    assert (tmp_path / "tok" / ".done").read_text() == "stage=tok\nmerges=1\n"
    assert run.stage("tok", d, "stage=tok\nmerges=1", files, _writer(calls)) is False  # up to date
    assert len(calls) == 1 and "tok: up to date, skipping" in capsys.readouterr().out
    assert run.stage("tok", d, "stage=tok\nmerges=2", files, _writer(calls)) is True  # stamp mismatch
    assert len(calls) == 2 and (tmp_path / "tok" / ".done").read_text() == "stage=tok\nmerges=2\n"
    os.unlink(files[0])
    assert run.stage("tok", d, "stage=tok\nmerges=2", files, _writer(calls)) is True  # an output is missing
    assert len(calls) == 3
    # a stage that fails leaves no stamp behind (only the INCOMPLETE marker that keeps the directory
    # mt-prep's), so it runs again next time
    with pytest.raises(RuntimeError):
        run.stage("tok", d, "stage=tok\nmerges=3", files, lambda x: (_ for _ in ()).throw(RuntimeError("boom")))
    assert (tmp_path / "tok" / ".done").read_text() == INCOMPLETE + "\n"
    assert not PrepRun.current(d, "stage=tok\nmerges=2", files) and not PrepRun.current(d, "stage=tok\nmerges=3", files)


def test_swap_stage_replaces_the_directory_only_when_it_succeeds(tmp_path):
    run, d, calls = PrepRun("t", str(tmp_path)), str(tmp_path / "bin"), []
    run.stage("bin", d, "s1", [], _writer(calls, text="one\n"), swap=True)
    assert calls[0] != d and (tmp_path / "bin" / "a.txt").read_text() == "one\n"

    def fails(x):
        _writer(calls, text="two\n")(x)
        raise SystemExit(1)
    with pytest.raises(SystemExit):
        run.stage("bin", d, "s2", [], fails, swap=True)
    assert (tmp_path / "bin" / "a.txt").read_text() == "one\n" and (tmp_path / "bin" / ".done").read_text() == "s1\n"
    assert sorted(os.listdir(tmp_path)) == ["bin"]  # no bin.tmp.<pid> left
    run.stage("bin", d, "s2", [], _writer(calls, name="b.txt"), swap=True)
    assert sorted(os.listdir(d)) == [".done", "b.txt"]  # the new directory, not a merge


def test_dry_run_prints_every_stage_and_writes_nothing(tmp_path, capsys):
    real, dry = PrepRun("t", str(tmp_path)), PrepRun("t", str(tmp_path / "new"), dry=True)
    d, calls = str(tmp_path / "tok"), []
    real.stage("tok", d, "s", [], _writer(calls))
    dry.stage("tok", d, "s", [], lambda x: dry.step("tokenise"))  # up to date: still listed
    out = capsys.readouterr().out
    assert "tok: up to date; a real run skips it" in out and "would tokenise" in out
    dry.stage("bpe", str(tmp_path / "new" / "bpe"), "s", [], lambda x: dry.step("learn"), swap=True)
    with dry.lock():
        pass
    assert not (tmp_path / "new").exists()


def test_lock_removes_what_a_killed_run_left(tmp_path):
    for rel in ("bin.tmp.4242/dict.en.txt", "tok/.train.en.k2j3h4.tmp", "raw/test.en", "L128/bpe/.x.de.abc.tmp",
                "L128/bpe/test.de", "tmp.keep/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    with PrepRun("t", str(tmp_path)).lock():
        left = sorted(os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs)
    assert left == [".lock", "L128/bpe/test.de", "raw/test.en", "tmp.keep/notes.txt"]
    assert remove_run_leftovers(str(tmp_path)) == []


# ---------------------------------------------------------------------------------------------
# an end-to-end stamp mismatch, and the command line
# ---------------------------------------------------------------------------------------------
def _raw_dir(path):
    os.makedirs(path, exist_ok=True)
    words = "a man in a red shirt rides a bike down the street while two dogs run".split()
    for split, n in (("train", 300), ("val", 20), ("test_2016_flickr", 20), ("test_2017_flickr", 20)):
        for lang in ("en", "de"):
            lines = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 7)) + f" {lang} ." for i in range(n)]
            with gzip.open(os.path.join(path, f"{split}.{lang}.gz"), "wb") as f:
                f.write(("\n".join(lines) + "\n").encode())


def test_a_changed_stamp_redoes_exactly_that_stage(tmp_path):
    raw, out = str(tmp_path / "raw_in"), tmp_path / "out"
    _raw_dir(raw)
    args = ("--raw-dir", raw, "--out", str(out), "--no-checksum", "--workers", "1", "--bpe-merges", "30")
    r = prepare("multi30k", *args)
    assert r.returncode == 0, r.stderr
    stamp, codes = (out / "bpe" / ".done").read_text(), (out / "bpe" / "codes").read_bytes()
    (out / "bpe" / ".done").write_text(stamp.replace("bpe_merges=30", "bpe_merges=31"))
    r = prepare("multi30k", *args)
    assert r.returncode == 0, r.stderr
    for stage in ("raw", "tok", "bin"):
        assert f"{stage}: up to date" in r.stdout
    assert "bpe: done" in r.stdout and "bpe: up to date" not in r.stdout
    assert (out / "bpe" / ".done").read_text() == stamp and (out / "bpe" / "codes").read_bytes() == codes
    # a changed parameter redoes its stage and everything after it
    r = prepare("multi30k", *args[:-1], "40")
    assert "tok: up to date" in r.stdout and "bpe: done" in r.stdout and "bin: done" in r.stdout


def test_command_line_lists_corpora_and_names_valid_choices(tmp_path, capsys):
    assert cli.main(["--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"multi30k", "long_documents", "iwslt14_de_en", "wmt14_en_de"} <= set(listed)
    assert cli.main(["nope"]) == 1
    assert "unknown corpus 'nope'; valid: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["multi30k", "--variant", "x"])  # Multi30k has no variants
    err = capsys.readouterr().err
    assert "unknown option '--variant'" in err and "--raw-dir" in err and "--train-lines" in err
    with pytest.raises(SystemExit):
        cli.main(["multi30k", "--src", "fr", "--dry-run"])
    assert "--src must be one of: en, de (got 'fr')" in capsys.readouterr().err
    # the long-document prep dirs are variants named by their length (experiment.prep_cmd passes them)
    assert cli.main(["long_documents", "--dry-run", "--download", "--out", str(tmp_path / "o"), "--variant", "L128"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["long_documents", "--dry-run", "--download", "--lengths", "128,256", "--variant", "L512"])
    assert "unknown variant 'L512' of long_documents; valid: L128, L256" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# --until: a partial run that a later run continues
# ---------------------------------------------------------------------------------------------
def test_until_raises_after_its_stage_whether_it_ran_or_was_up_to_date(tmp_path, capsys):
    run, calls = PrepRun("t", str(tmp_path), until="tok"), []
    assert run.stage("raw", str(tmp_path / "raw"), "s", [], _writer(calls)) is True  # another stage: no stop
    for _ in range(2):  # runs, then is up to date: both stop
        with pytest.raises(StopAfter) as stop:
            run.stage("tok", str(tmp_path / "tok"), "s", [], _writer(calls))
        assert (stop.value.stage, stop.value.directory) == ("tok", str(tmp_path / "tok"))
    assert len(calls) == 2 and (tmp_path / "tok" / ".done").read_text() == "s\n"  # the stamp is written first
    dry = PrepRun("t", str(tmp_path / "new"), dry=True, until="bpe")
    with pytest.raises(StopAfter):
        dry.stage("bpe", str(tmp_path / "new" / "bpe"), "s", [], lambda x: dry.step("learn"))
    assert "would learn" in capsys.readouterr().out and not (tmp_path / "new").exists()


def test_until_stops_a_real_prep_and_the_next_run_goes_on_from_there(tmp_path):
    raw, out = str(tmp_path / "raw_in"), tmp_path / "out"
    _raw_dir(raw)
    args = ("--raw-dir", raw, "--out", str(out), "--no-checksum", "--workers", "1", "--bpe-merges", "30")
    r = prepare("multi30k", *args, "--until", "raw")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == str(out / "raw") and "stopped after stage raw (--until raw)" in r.stdout
    assert sorted(p for p in os.listdir(out) if not p.startswith(".")) == ["raw"]
    r = prepare("multi30k", *args, "--until", "bpe")
    assert r.returncode == 0, r.stderr
    assert "raw: up to date" in r.stdout and "tok: done" in r.stdout and "bpe: done" in r.stdout
    assert r.stdout.splitlines()[-1] == str(out / "bpe") and not (out / "bin").exists()
    r = prepare("multi30k", *args)  # the rest: what --until left is up to date
    assert r.returncode == 0, r.stderr
    assert all(f"{s}: up to date" in r.stdout for s in ("raw", "tok", "bpe")) and "bin: done" in r.stdout
    assert r.stdout.splitlines()[-1] == str(out / "bin")
    before = (out / "bin" / ".done").stat().st_mtime_ns
    r = prepare("multi30k", *args, "--until", "tok")  # a stop before a finished stage leaves it as it is
    assert r.returncode == 0 and "bpe" not in r.stdout.split("stopped after")[0].replace("bpe_merges", "")
    assert (out / "bin" / ".done").stat().st_mtime_ns == before


def test_until_names_the_valid_stages_before_any_work(tmp_path, capsys):
    out = tmp_path / "o"
    with pytest.raises(SystemExit):
        cli.main(["multi30k", "--until", "nope", "--out", str(out)])
    assert "--until must be one of: raw, tok, bpe, char, bin (got 'nope')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["multi30k", "--until", "char", "--out", str(out)])  # BPE run: no char stage
    assert "--until char: this run segments with BPE; this run's stages: raw, tok, bpe, bin" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["multi30k", "--char", "--until", "bpe", "--out", str(out)])
    assert ("--until bpe: this run segments with characters (--char); this run's stages: raw, tok, char, bin"
            in capsys.readouterr().err)
    # a recipe without truecasing has no tc stage (checked against the recipe, before the lock or a download)
    with pytest.raises(SystemExit):
        cli.main(["iwslt14_de_en", "--download", "--until", "tc", "--out", str(out)])
    assert ("--until tc: this run does not truecase (--truecase); this run's stages: raw, tok, bpe, bin"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):  # a word-level recipe has neither bpe nor char; truecasing adds tc
        cli.main(["iwslt14_de_en", "--download", "--truecase", "--word-vocab", "8000", "--until", "bpe", "--out", str(out)])
    assert ("--until bpe: this run's recipe segments into words; this run's stages: raw, tok, tc, bin"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):  # a recipe that cannot be resolved is refused by the same check
        cli.main(["iwslt14_de_en", "--download", "--word-vocab", "8000", "--bpe-merges", "100", "--until", "tok",
                  "--out", str(out)])
    assert "has no BPE: drop --bpe / --bpe-merges / --bpe-codes" in capsys.readouterr().err
    assert not out.exists()
    # the long-document prep: pack stops after every length's pack stage, before any bin stage
    full = cli.main(["long_documents", "--dry-run", "--download", "--lengths", "128,256", "--out", str(out)])
    whole = capsys.readouterr().out
    assert full == 0 and cli.main(["long_documents", "--dry-run", "--download", "--lengths", "128,256",
                                   "--out", str(out), "--until", "pack"]) == 0
    part = capsys.readouterr().out
    assert "would pack L=256" in part and part.splitlines()[-1] == str(out)
    assert whole.count("would binarize") == 3 and part.count("would binarize") == 1  # the dict stage's only
    assert not out.exists()


def test_references_only_prep_command_stops_where_each_corpus_writes_its_references(tmp_path):
    """``prep_cmd(budget, references_only=True)``: what re-scoring a run needs (Multi30k: raw/; the
    long-document sets: each length's pack, L<n>/raw/), as the message of a missing reference gives it."""
    import json

    from mt_pipeline import evidence
    from mt_pipeline.budget import load_budget, prep_cmd

    for budget, stage in (("configs/multi30k/converged.yaml", "raw"), ("configs/long_documents/small_cpu_L128.yaml", "pack")):
        b = load_budget(os.path.join(ROOT, budget))
        full, refs = prep_cmd(b), prep_cmd(b, references_only=True)
        at = refs.index("--until")
        assert refs[at + 1] == stage and refs[:at] + refs[at + 2:] == full
    rec = tmp_path / "result.json"
    rec.write_text(json.dumps({"config": {"budget": load_budget(os.path.join(ROOT, "configs/multi30k/converged.yaml"))},
                               "scores": {"test": {"hyp": str(tmp_path / "h"), "ref": str(tmp_path / "missing.de")}}}))
    with pytest.raises(evidence.RescoreError, match=r"is missing; prepare it first: bash "
                       r"data-prep/multi30k/prepare\.sh --out data-bin/multi30k_en_de .*--until raw"):
        evidence.rescore(str(rec))
