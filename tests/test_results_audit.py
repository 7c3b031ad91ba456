"""Issue 27: every number on a results page can be traced -- or says plainly that it cannot.

* Every results page of a trained regime (smoke, diagnostic, converged; not the index files and not
  the claims page ``results/README.md``, which quotes these pages and whose converged verdicts
  ``mt-campaign render`` writes from the evidence) either names, per row, the committed evidence
  (``results/runs/...``: result.json, hypotheses, training log) -- and then every score cell of its
  tables is the recorded score of that evidence: each ``ours <subset>`` column the subset's SacreBLEU
  (mean, and sample sd, over the row's seeds; with one seed also the tokenized BLEU in brackets), the
  ``chrF <subset>`` column its chrF (:func:`mt_pipeline.tables.render`; the column labels are the
  table spec's ``subsets``, named by the page's ``Regenerate: `mt-table --table ...``` line) -- or carries the line
  :data:`NO_EVIDENCE`, which says its numbers predate committed evidence and names the command that
  re-runs them.  (The evidence
  itself re-scores from its hypotheses: ``test_campaign.test_every_committed_run_rescores_from_its_hypotheses``.)
* Every index file ``results/<paper>/<table>.md`` is what the current code renders from the
  committed tables and evidence (``mt_pipeline.reproduce.render_indexes``), apart from the line naming
  the commit it was written at: a stale index row cannot survive.
"""

import json
import os
import re
import statistics

import pytest
import yaml

from mt_pipeline import reproduce
from mt_pipeline.evidence import NO_EVIDENCE, resolve
from mt_pipeline.provenance import ROOT

RESULTS = os.path.join(ROOT, "results")
NUMBER = re.compile(r"^-?\d+\.\d+")


def _pages():
    out = []
    for d, dirs, files in os.walk(RESULTS):
        dirs[:] = [x for x in dirs if os.path.join(d, x) != os.path.join(RESULTS, "runs")]
        out += [os.path.join(d, f) for f in files if f.endswith(".md")]
    return sorted(out)


def _is_index(text):
    return re.match(r"# \S+ \S+: what ran, at which scale", text) is not None


def _tables(text):
    """``[(header cells, [row cells])]`` of the markdown tables in ``text``."""
    out, lines = [], text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def _score_cells(text):
    """``[(row id, cell)]``: the first score column (``ours ...`` or ``BLEU ...``) of every table,
    numeric cells only."""
    cells = []
    for header, rows in _tables(text):
        cols = [k for k, h in enumerate(header) if h.lower().startswith("ours") or h.startswith("BLEU")]
        if not cols:
            continue
        for r in rows:
            if len(r) > cols[0] and NUMBER.match(r[cols[0]]):
                cells.append((r[0], r[cols[0]]))
    return cells


REGENERATE = re.compile(r"Regenerate: `mt-table --table (\S+?)(?: --budget \S+)?`")


def _spec_subsets(text):
    """``{subset: label}`` of the table spec the page's ``Regenerate:`` line names (the order and
    labels of its ``ours <label>`` / ``chrF <label>`` columns, :func:`mt_pipeline.tables.render`);
    None when the page names no spec."""
    m = REGENERATE.search(text)
    if not m:
        return None
    with open(os.path.join(ROOT, m.group(1))) as f:
        return yaml.safe_load(f)["subsets"]


def _subset_score_cells(text):
    """``([(row id, header, cell, subset, metric)], [unmapped score headers])``: every ``ours
    <label>`` (metric ``bleu``) and ``chrF <label>`` (metric ``chrf``) column of every table of a page
    rendered by :func:`mt_pipeline.tables.render`, mapped to its subset by the spec's labels; numeric
    cells only.  A page naming no spec gives its first score column as the first subset's BLEU
    (:func:`_score_cells`, subset None)."""
    subsets = _spec_subsets(text)
    if subsets is None:
        return [(row, None, cell, None, "bleu") for row, cell in _score_cells(text)], []
    by_header = {f"ours {label}": (s, "bleu") for s, label in subsets.items()}
    by_header.update({f"chrF {label}": (s, "chrf") for s, label in subsets.items()})
    cells, unmapped = [], []
    for header, rows in _tables(text):
        for k, h in enumerate(header):
            if h in by_header:
                subset, metric = by_header[h]
                cells += [(r[0], h, r[k], subset, metric) for r in rows if len(r) > k and NUMBER.match(r[k])]
            elif h.lower().startswith(("ours", "bleu", "chrf")):
                unmapped.append(h)
    return cells, unmapped


def _expected_cell(cell, values, tok_values):
    """The problem with a cell showing the recorded ``values`` (one per seed), or None: the mean
    (2 decimals), the sample sd after ``±`` when shown, the tokenized BLEU ``(x)`` when shown."""
    want = f"{statistics.mean(values):.2f}"
    if NUMBER.match(cell).group(0) != want:
        return f"shows {cell}, its evidence says {want}"
    m = re.search(r"± (\d+\.\d+)", cell)
    if m and (len(values) < 2 or m.group(1) != f"{statistics.stdev(values):.2f}"):
        return f"shows {cell}, its evidence's sd over {len(values)} seed(s) is " + (
            f"{statistics.stdev(values):.2f}" if len(values) > 1 else "undefined")
    m = re.search(r"\((\d+\.\d+)\)", cell)
    if m and (len(tok_values) != 1 or tok_values[0] is None or m.group(1) != f"{tok_values[0]:.2f}"):
        return f"shows tokenized BLEU ({m.group(1)}), its evidence records {tok_values}"
    return None


def _window_cells(text):
    """``[(row id, cell)]`` of every table's ``window`` column (Flexible Attention Table 1: the
    positions scored, §5.2's per-sentence average), numeric cells only."""
    cells = []
    for header, rows in _tables(text):
        if "window" in header:
            k = header.index("window")
            cells += [(r[0], r[k]) for r in rows if len(r) > k and NUMBER.match(r[k])]
    return cells


def _evidence_by_row(text):
    """``{row id: [evidence dirs]}`` from the per-row provenance sections of a rendered table."""
    out, row = {}, None
    for line in text.splitlines():
        m = re.match(r"### (?:Row|Model) (\S+?):", line)
        if m:
            row = m.group(1)
        m = re.match(r"- committed evidence \(result\.json, hypotheses(?:, training log)?\): `([^`]+)`", line)
        if m and row is not None:  # a decode of a run under other settings has no training log
            out.setdefault(row, []).append(m.group(1))
    return out


TRAINED = re.compile(r"\*\*Regime: (smoke|diagnostic|converged)\*\*")
PAGES = [p for p in _pages() if os.path.basename(p) != "README.md" or os.path.dirname(p) != RESULTS]
TRAINED_PAGES = [p for p in PAGES if not _is_index(open(p).read()) and TRAINED.search(open(p).read())]


def test_the_audit_finds_the_pages_it_is_about():
    """The detection is not vacuous: the converged ReLA Table 1, a smoke table and the analysis are
    among the pages, and score cells are found in both tables."""
    rel = {os.path.relpath(p, ROOT): p for p in TRAINED_PAGES}
    for want in ("results/rela/table1_multi30k_converged.md", "results/rela/table1_multi30k.md",
                 "results/analysis/analysis.md", "results/flexible/table1_multi30k.md"):
        assert want in rel, sorted(rel)
    assert len(_score_cells(open(rel["results/rela/table1_multi30k.md"]).read())) == 13
    assert len(_score_cells(open(rel["results/flexible/table1_multi30k.md"]).read())) >= 4
    # every BLEU and chrF column of a rendered table is mapped to its subset and checked
    cells, unmapped = _subset_score_cells(open(rel["results/rela/table1_multi30k.md"]).read())
    assert unmapped == []
    assert sorted({(h, s, m) for _, h, _, s, m in cells}) == [
        ("chrF test2016", "test", "chrf"), ("ours test2016", "test", "bleu"), ("ours test2017", "test1", "bleu")]
    assert len(cells) == 3 * 13


@pytest.mark.parametrize("page", TRAINED_PAGES, ids=lambda p: os.path.relpath(p, RESULTS))
def test_every_score_names_its_committed_evidence_or_the_page_says_there_is_none(page):
    text = open(page).read()
    cells, _ = _subset_score_cells(text)
    evidence = _evidence_by_row(text)
    if NO_EVIDENCE in text:
        assert not evidence, f"{page}: says it has no evidence but names some"
        assert "mt-campaign run --plan configs/campaign/" in text, f"{page}: the marker must name the re-run command"
        return
    assert evidence, f"{page}: names no committed evidence and does not say it has none ({NO_EVIDENCE})"
    for row, header, cell, subset, metric in cells:
        dirs = evidence.get(row)
        assert dirs, f"{page}: row {row} shows {cell} but names no committed evidence (nor says there is none)"
        values, tok = [], []
        for d in dirs:
            path = os.path.join(ROOT, d, "result.json")
            assert os.path.exists(path), f"{page}: row {row}: {d}/result.json is not in the repository"
            res = json.load(open(path))
            key = subset or next(iter(res["scores"]))
            assert key in res["scores"], f"{page}: row {row} shows {cell} under {header}, {d} records no {key} scores"
            assert os.path.exists(resolve(res["scores"][key]["hyp"])), f"{d}: hypotheses missing"
            values.append(res["scores"][key][metric])
            tok.append(res["scores"][key].get("tok_bleu"))
        problem = _expected_cell(cell, values, tok if metric == "bleu" else [])
        assert problem is None, f"{page}: row {row}, column {header or 'first score'}: {problem}"
    for row, cell in _window_cells(text):
        windows = []
        for d in evidence.get(row) or []:
            res = json.load(open(os.path.join(ROOT, d, "result.json")))
            w = res["scores"][next(iter(res["scores"]))].get("window")
            assert w, f"{page}: row {row} shows window {cell}, but {d} records no window (decoded before it was kept)"
            windows.append(w["window"])
        assert windows, f"{page}: row {row} shows window {cell} but names no committed evidence"
        assert cell == f"{statistics.mean(windows):.2f}", f"{page}: row {row} shows window {cell}, its evidence {windows}"


def _models(text):
    """``{label: {"sha256": ..., "evidence": ...}}`` of an analysis page's ``### Model`` entries
    (:func:`fairseq_plugins.provenance.models_markdown`)."""
    out, label = {}, None
    for line in text.splitlines():
        m = re.match(r"### Model (.+?): `", line)  # labels hold ':' (aer:LABEL) and spaces (aer:LABEL seed K)
        if m:
            label = m.group(1)
            out[label] = {}
        elif line.startswith("#"):
            label = None
        elif label is not None:
            m = re.match(r"- checkpoint sha256: `([0-9a-f]{64})`", line)
            if m:
                out[label]["sha256"] = m.group(1)
            m = re.match(r"- committed evidence \(result\.json, hypotheses, training log\): `([^`]+)`", line)
            if m:
                out[label]["evidence"] = m.group(1)
    return out


@pytest.mark.parametrize("page", [p for p in TRAINED_PAGES if _models(open(p).read())] or [pytest.param(
    None, marks=pytest.mark.skip(reason="no analysis page names its trained models yet"))],
    ids=lambda p: p and os.path.relpath(p, RESULTS))
def test_every_analysed_model_is_the_checkpoint_its_committed_evidence_scored(page):
    """An analysis page that names a model's committed evidence measured that run's scored model:
    the checkpoint SHA-256 the page records is the evidence's ``decoded_checkpoint_sha256``; a page
    with a model without evidence says the page has none."""
    text = open(page).read()
    for label, m in _models(text).items():
        assert "sha256" in m, f"{page}: model {label} records no checkpoint sha256"
        if "evidence" not in m:
            assert NO_EVIDENCE in text, f"{page}: model {label} names no committed evidence and the page does not say so"
            continue
        res = json.load(open(os.path.join(ROOT, m["evidence"], "result.json")))
        assert res.get("decoded_checkpoint_sha256") == m["sha256"], (
            f"{page}: model {label}'s checkpoint is not the one {m['evidence']} scored")


def test_index_files_are_what_the_current_code_renders(tmp_path):
    fresh = reproduce.render_indexes(results_dir=str(tmp_path))
    assert fresh, "no index rendered"
    for path in fresh:
        rel = os.path.relpath(path, str(tmp_path))
        committed = os.path.join(RESULTS, rel)
        assert os.path.exists(committed), f"results/{rel} is missing: run `reproduce <paper> <table> --index-only`"
        strip = reproduce._without_commit_line
        assert strip(open(committed).read()) == strip(open(path).read()), (
            f"results/{rel} is stale: `mt-campaign render` (or `reproduce <paper> <table> --index-only`) rewrites it")


def test_every_committed_decode_decoded_its_runs_checkpoint():
    """A re-decode committed beside a run's evidence (``decodes/<name>/``, e.g. Flexible's tau
    sweeps) is of the checkpoint the run's own record scored: when a run trains again, its export
    drops the old model's decodes (``evidence.drop_stale_decodes``), so no page can cite a decode of
    a model that no longer exists."""
    from mt_pipeline import evidence

    runs = sorted({os.path.dirname(os.path.dirname(os.path.dirname(p)))
                   for p in evidence.committed_results() if f"{os.sep}decodes{os.sep}" in p})
    assert runs, "no committed decode found"
    stale = {os.path.relpath(r, ROOT): [os.path.basename(d) for d in evidence.stale_decodes(r)] for r in runs}
    assert not {r: d for r, d in stale.items() if d}, "decodes of a replaced model"


def test_export_drops_the_decodes_of_a_replaced_model(tmp_path, monkeypatch):
    """Re-exporting a run whose checkpoint changed removes the decodes of the old checkpoint (the
    files their manifests list, nothing else) and keeps those of the current one."""
    from mt_pipeline import evidence

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    run = tmp_path / "runs" / "t" / "row1"
    run.mkdir(parents=True)
    (run / "test.hyp").write_text("a b c\n")
    ref = tmp_path / "ref.txt"
    ref.write_text("a b c\n")

    def result(sha):
        (run / "result.json").write_text(json.dumps({
            "status": "done", "git_commit": "abc", "decoded_checkpoint_sha256": sha,
            "scores": {"test": {"bleu": 100.0, "hyp": str(run / "test.hyp"), "ref": str(ref), "checkpoint_sha256": sha}}}))

    def decode(name, sha):
        d = tmp_path / "dec" / name
        d.mkdir(parents=True)
        (d / "test.hyp.detok").write_text("a b c\n")
        (d / "test.json").write_text(json.dumps({"bleu": 100.0, "hyp": str(d / "test.hyp.detok"), "ref": str(ref),
                                                 "checkpoint": str(run / "c.pt"), "checkpoint_sha256": sha}))
        return evidence.export_decode(str(run), "smoke", name, str(d), ["test"], {"x": name}, "cmd")

    result("a" * 64)
    ev = evidence.export(str(run), "smoke")
    old_dec = decode("tau_1", "a" * 64)
    assert evidence.stale_decodes(ev) == []
    (tmp_path / "evidence" / "note.txt").write_text("not the exporter's")
    result("b" * 64)  # trained again: another checkpoint (the evidence still records the old one)
    assert evidence.stale_decodes(ev) == []
    new_dec = decode("tau_2", "b" * 64)
    assert evidence.stale_decodes(ev) == [new_dec]  # a decode of a checkpoint the record does not name
    evidence.export(str(run), "smoke")
    assert not os.path.exists(old_dec) and os.path.exists(os.path.join(new_dec, "result.json"))
    assert (tmp_path / "evidence" / "note.txt").exists() and evidence.stale_decodes(ev) == []


def test_export_is_all_or_nothing_keeps_a_success_over_a_later_failure_and_knows_its_own_finish(tmp_path, monkeypatch):
    """A review's probes: a missing source left the evidence half old, half new; a failed re-training
    replaced the committed evidence of an earlier successful one; staleness was read from file times, so
    a checkout that rewrote the evidence hid a newer local finish from the export."""
    from mt_pipeline import evidence

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    run = tmp_path / "runs" / "t" / "row1"
    run.mkdir(parents=True)
    ref = tmp_path / "ref.txt"
    ref.write_text("a b c\n")

    def result(status, hyp_text, when, subsets=("test",)):
        for s in subsets:
            (run / f"{s}.hyp").write_text(hyp_text)
        scores = {s: {"bleu": 100.0, "hyp": str(run / f"{s}.hyp"), "ref": str(ref)} for s in subsets}
        (run / "result.json").write_text(json.dumps({"status": status, "git_commit": "abc", "time": when,
                                                     "decoded_checkpoint_sha256": when, "scores": scores}))

    result("done", "old\n", "t1")
    assert not evidence.is_current(str(run), "smoke")
    ev = evidence.export(str(run), "smoke")
    assert evidence.is_current(str(run), "smoke")
    old = {n: open(os.path.join(ev, n), "rb").read() for n in sorted(os.listdir(ev))}
    # a later finish whose second subset's hypotheses are gone: refused before anything is written
    result("done", "new\n", "t2", subsets=("test", "test1"))
    os.unlink(run / "test1.hyp")
    with pytest.raises(FileNotFoundError, match="test1.hyp missing; nothing exported"):
        evidence.export(str(run), "smoke")
    assert {n: open(os.path.join(ev, n), "rb").read() for n in sorted(os.listdir(ev))} == old
    # the evidence touched by a checkout is still not this finish: judged by content, not time
    os.utime(os.path.join(ev, "result.json"), (4e9, 4e9))
    assert not evidence.is_current(str(run), "smoke")
    # an analysis written after the export makes it stale too
    result("done", "new\n", "t2")
    evidence.export(str(run), "smoke")
    assert evidence.is_current(str(run), "smoke")
    (run / "analysis_x.json").write_text("{}")
    assert not evidence.is_current(str(run), "smoke")
    evidence.export(str(run), "smoke")
    assert evidence.is_current(str(run), "smoke")
    done = json.load(open(os.path.join(ev, "result.json")))
    # trained again (for a post-training step) and failed: the successful evidence stays
    (run / "result.json").write_text(json.dumps({"status": "failed", "time": "t3", "scores": {}}))
    assert evidence.export(str(run), "smoke") is None
    assert json.load(open(os.path.join(ev, "result.json"))) == done and os.path.exists(os.path.join(ev, "test.hyp.detok.gz"))
    # a failed run without successful evidence is exported (its record says why)
    other = tmp_path / "runs" / "t" / "row2"
    other.mkdir()
    (other / "result.json").write_text(json.dumps({"status": "failed", "time": "t1", "scores": {}}))
    assert json.load(open(os.path.join(evidence.export(str(other), "smoke"), "result.json")))["status"] == "failed"


def _analysis_pages():
    """``[(analysis.json, page)]`` of every committed attention analysis: the page its own recorded
    command wrote (``--md PATH``, else ``analysis.md`` beside the JSON in ``--out``)."""
    import glob
    import shlex

    out = []
    for j in sorted(glob.glob(os.path.join(RESULTS, "**", "analysis.json"), recursive=True)):
        argv = shlex.split(json.load(open(j))["provenance"]["command"])
        md = argv[argv.index("--md") + 1] if "--md" in argv else os.path.join(argv[argv.index("--out") + 1],
                                                                               "analysis.md")
        out.append((j, os.path.join(ROOT, md)))
    return out


@pytest.mark.parametrize("record,page", _analysis_pages(), ids=lambda p: os.path.relpath(p, RESULTS))
def test_every_committed_analysis_page_is_what_its_json_renders_to(record, page):
    """A committed analysis page is today's rendering of its committed JSON
    (``fairseq_plugins.analysis.cli.render_markdown``), so a page never states less or other than its
    record -- e.g. the AER's subword-merge convention, stated since 2026-11-30 -- and a change of the
    renderer re-renders the pages with it."""
    from fairseq_plugins.analysis.cli import render_markdown

    assert os.path.exists(page), f"{record}: the page its command wrote ({page}) is not committed"
    rendered = render_markdown(json.load(open(record)))
    assert open(page).read() == rendered, (
        f"{os.path.relpath(page, ROOT)} differs from the rendering of {os.path.relpath(record, ROOT)}: re-render it "
        "(write_text_atomic(page, render_markdown(json.load(open(record)))))")


def test_the_analysis_pages_are_found():
    """Not vacuous: the smoke analysis, the converged one and both AER domain checks."""
    pages = {os.path.relpath(p, RESULTS) for _, p in _analysis_pages()}
    assert {"analysis/analysis.md", "analysis/converged_rela_table1/analysis.md", "analysis/aer_domain_check.md",
            "analysis/aer_domain_check_mean.md"} <= pages, pages
