"""mt-bench-prep (mt_pipeline.bench_prep): the data-prep memory benchmark measures what a process
tree really holds, splits it by stage, refuses bad options before any work, and runs end to end
on the real Tatoeba De-En and WMT files of ../shared/data."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import train_helpers as th
from mt_pipeline import bench_prep
from mt_pipeline.prep import spec as prep_spec

needs_data = pytest.mark.skipif(
    not all(os.path.isfile(bench_prep.DEFAULT_CORPUS.format(lang=lang)) for lang in bench_prep.LANGS)
    or not os.path.isdir(bench_prep.WMT), reason="../shared/data is not here")
needs_proc = pytest.mark.skipif(not os.path.isfile("/proc/self/smaps_rollup"), reason="needs Linux /proc")
MIB = 1024 * 1024


@needs_proc
def test_sampler_counts_every_process_of_the_session_and_shared_pages_once():
    """A parent holding 40 MiB forks a child that writes 80 MiB of its own: the session's summed
    RSS sees both (~120 MiB + two interpreters), the summed PSS counts the pages they share once,
    two processes are seen, and the child's VmHWM is its own 80 MiB."""
    script = textwrap.dedent("""
        import os, sys, time
        mine = bytearray(b"\\1") * (40 << 20)          # written: resident in the parent
        pid = os.fork()
        if pid == 0:
            own = bytearray(b"\\2") * (80 << 20)       # the child's own pages
            sys.stdout.write("ready\\n"); sys.stdout.flush()
            time.sleep(2.0)
            os._exit(0)
        time.sleep(2.5)
        os.waitpid(pid, 0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    sampler = bench_prep.TreeSampler(proc.pid, interval=0.05)
    sampler.start()
    assert proc.stdout.readline() == "ready\n"
    proc.wait()
    sampler.stop()
    peak = max(sampler.samples, key=lambda s: s[2])
    t, pss, rss, n, largest = peak
    assert n == 2
    assert rss >= 155 * 1024  # 40 (parent) + 40 (shared, counted again) + 80 (child's own), in KiB
    assert 115 * 1024 <= pss < rss - 30 * 1024  # the 40 MiB the two share counted once
    assert largest >= 120 * 1024  # the child: 40 shared + 80 own
    assert max(sampler.hwm.values()) >= 120 * 1024
    assert sampler.samples[-1][3] == 0  # the last sample, after the exit: nothing left


def test_stage_peaks_split_the_samples_at_each_stage_end():
    """Samples after one stage's end and up to the next belong to the next; a stage too short for
    a sample takes the last one before its end; the timeline keeps each second's peak."""
    k = 1024
    samples = [(0.5, 100 * k, 150 * k, 1, 150 * k), (1.0, 300 * k, 500 * k, 3, 200 * k),
               (1.5, 120 * k, 160 * k, 1, 160 * k), (2.5, 400 * k, 700 * k, 3, 210 * k)]
    peaks = bench_prep.stage_peaks(samples, {"raw": 0.7, "tok": 1.2, "tc": 1.3, "bpe": 3.0})
    assert list(peaks) == ["raw", "tok", "tc", "bpe"]
    assert peaks["raw"]["peak_pss_mib"] == 100 and peaks["raw"]["max_processes"] == 1
    assert peaks["tok"]["peak_pss_mib"] == 300 and peaks["tok"]["peak_rss_mib"] == 500
    assert peaks["tok"]["largest_process_rss_mib"] == 200 and peaks["tok"]["max_processes"] == 3
    assert peaks["tc"]["peak_pss_mib"] == 300  # no sample inside (1.2, 1.3]: the last one before
    assert peaks["bpe"]["peak_pss_mib"] == 400 and peaks["bpe"]["start_s"] == 1.3
    assert bench_prep.timeline(samples) == [(0.0, 100.0), (1.0, 300.0), (2.0, 400.0)]
    runs = [{"pairs": 1_000_000, "overall": {"peak_pss_mib": 400.0}, "stages": peaks},
            {"pairs": 3_000_000, "overall": {"peak_pss_mib": 420.0}, "stages": peaks}]
    assert bench_prep.growth_per_million(runs, "peak_pss_mib") == pytest.approx(10.0)
    assert bench_prep.growth_per_million(runs, "peak_pss_mib", "tok") == 0.0


@pytest.mark.parametrize("args, message", [
    (["--sizes", "4,1"], "at least two increasing positive multiples"),
    (["--sizes", "1"], "at least two increasing positive multiples"),
    (["--sizes", "1,x"], "comma-separated positive integers"),
    (["--workers", "0"], "--workers 0: must be >= 1"),
    (["--interval", "0"], "choose 0.01..10 seconds"),
    (["--out", "page.txt"], "give a .md path"),
])
def test_bad_options_stop_before_any_work(tmp_path, capsys, args, message):
    """Each bad option stops at parsing with a message saying what is valid; nothing is written."""
    with pytest.raises(SystemExit) as err:
        bench_prep.main(args + ([] if "--out" in args else ["--out", str(tmp_path / "m.md")]))
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_work_dir_with_files_not_its_own_is_refused(tmp_path, capsys):
    """The tool removes only what it wrote: a non-empty --work-dir is refused and left alone."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "user.txt").write_text("mine")
    with pytest.raises(SystemExit):
        bench_prep.main(["--work-dir", str(work), "--out", str(tmp_path / "m.md")])
    assert "not empty" in capsys.readouterr().err
    assert os.listdir(work) == ["user.txt"] and not (tmp_path / "m.md").exists()


@needs_data
@needs_proc
def test_end_to_end_on_real_data_measures_every_stage_and_cleans_up(tmp_path):
    """Two sizes of real Tatoeba pairs through ``mt-prep wmt14_en_de --truecase`` with 2 workers:
    every stage has a peak, the tokeniser runs the CLI and 2 workers at once, the page, JSON and
    plot are written, and the work directory (empty before) holds nothing afterwards."""
    work, out = tmp_path / "work", tmp_path / "res" / "m.md"
    work.mkdir()
    assert bench_prep.main(["--base-lines", "200", "--sizes", "1,2", "--bpe-merges", "100",
                            "--work-dir", str(work), "--out", str(out)]) == 0
    assert os.listdir(work) == []
    rec = json.loads(out.with_suffix(".json").read_text())
    assert [r["pairs"] for r in rec["runs"]] == [200, 400]
    for run in rec["runs"]:
        assert list(run["stages"]) == list(bench_prep.STAGES)
        assert all(s["peak_pss_mib"] > 10 for s in run["stages"].values())
        assert run["stages"]["tok"]["max_processes"] >= 3  # the CLI and its 2 tokeniser workers
        assert run["overall"]["peak_pss_mib"] <= run["overall"]["peak_rss_mib"]
    page = out.read_text()
    for stage in bench_prep.STAGES:
        assert f"| {stage} | " in page
    assert "**Regime: benchmark**" in page and "mt-bench-prep --base-lines 200" in page
    assert rec["provenance"]["data"]["corpus"]["de"] == os.path.relpath(
        bench_prep.DEFAULT_CORPUS.format(lang="de"), prep_spec.REPO)
    assert out.with_suffix(".png").stat().st_size > 1000


@needs_proc
def test_an_interrupted_measurement_stops_the_measured_session(tmp_path, monkeypatch):
    """Ctrl-C reaches the benchmark, not the mt-prep it started in its own session: that session
    is stopped too (it would go on writing into the work directory being removed)."""
    token = f"bench-prep-test-{os.getpid()}"

    class Interrupt:
        def match(self, line):
            raise KeyboardInterrupt

    monkeypatch.setattr(bench_prep, "_STAGE_END", Interrupt())
    child = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
             f"'{token}']); print('go', flush=True); time.sleep(5)")  # its own child outlives it
    with pytest.raises(KeyboardInterrupt):
        bench_prep.measure_size([sys.executable, "-c", child, token], str(tmp_path / "log"), 0.05)

    import time
    deadline = time.time() + 10
    while th.live_processes(token) and time.time() < deadline:
        time.sleep(0.1)
    assert th.live_processes(token) == []
