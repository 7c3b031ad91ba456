"""The experiment/table runners: budget inheritance, log parsing, spec checks, rendering."""

import json
import os
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from mt_pipeline import experiment
from mt_pipeline import tables as run_table

CONFIGS = os.path.join(ROOT, "configs")


def test_budget_base_is_merged_key_by_key(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("train: {lr: 0.001, max-update: 400}\ndata: {corpus: multi30k, subsets: [test]}\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {base}\ntrain: {{max-update: 10}}\ndata: {{variant: L128}}\n")
    b = experiment.load_budget(str(child))
    assert b["train"] == {"lr": 0.001, "max-update": 10}
    assert b["data"] == {"corpus": "multi30k", "subsets": ["test"], "variant": "L128"}
    assert "base" not in b


def test_budget_cycle_and_missing_file_fail_clearly(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"base: {b}\n")
    b.write_text(f"base: {a}\n")
    with pytest.raises(SystemExit, match="cycle"):
        experiment.load_budget(str(a))
    with pytest.raises(SystemExit, match="not found"):
        experiment.load_budget(str(tmp_path / "nope.yaml"))


def test_last_valid_metrics_parses_aux_terms(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "2026 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.1 | nll_loss 8.2 | num_updates 50\n"
        "2026 | INFO | train_inner | epoch 002: loss=7.0, num_updates=60\n"
        "2026 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.269 | nll_loss 6.343 | "
        "attn_entropy 1.2345 | attn_null_rate 0 | reluformer_norm 3.1e-05 | num_updates 100\n")
    m = experiment.last_valid_metrics(str(log))
    assert m["loss"] == 7.269 and m["attn_entropy"] == 1.2345 and m["num_updates"] == 100
    assert m["attn_null_rate"] == 0.0 and m["reluformer_norm"] == pytest.approx(3.1e-05)


def _is_table_spec(path):
    with open(path) as f:
        spec = yaml.safe_load(f)
    return isinstance(spec, dict) and "rows" in spec and "out" in spec


@pytest.mark.parametrize("table", sorted(
    os.path.join(d, f) for d, _, fs in os.walk(CONFIGS) for f in fs
    if f.endswith(".yaml") and "campaign" not in d and _is_table_spec(os.path.join(d, f))))
def test_every_table_spec_loads(table):
    """Every shipped table names existing budgets, archs and attention functions."""
    import fairseq_plugins  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_plugins.attention import attention_fn_names

    spec = run_table.load_table(table)
    for r in spec["rows"]:
        assert r["arch"] in ARCH_MODEL_REGISTRY, r
        assert set(r.get("fns") or []) <= set(attention_fn_names()), r


def test_spec_with_wrong_subsets_is_rejected(tmp_path):
    spec = yaml.safe_load(open(os.path.join(CONFIGS, "rela", "table1.yaml")))
    spec["subsets"] = {"test": "x"}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SystemExit, match="differ"):
        run_table.load_table(str(path))


def _rela_table1_spec(tmp_path, n_rows, **update):
    """ReLA Table 1's spec cut to its first ``n_rows`` rows, writing under ``tmp_path``."""
    spec = yaml.safe_load(open(os.path.join(CONFIGS, "rela", "table1.yaml")))
    spec.update(out=str(tmp_path / "out.md"), runs=str(tmp_path / "runs"), **update)
    spec["rows"] = spec["rows"][:n_rows]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    return run_table.load_table(str(path))


def test_a_table_with_a_user_dir_trains_and_analyses_every_row_with_it(tmp_path, monkeypatch):
    """A spec's ``user_dir`` (docs/extending.md: a function of one's own in a table) goes to every
    row's ``mt-experiment --user-dir`` (the one place a row becomes a run, for mt-table and
    mt-campaign) and to every analysis command, as an absolute path (repo-relative in the spec
    resolved against the repository); a directory that does not exist is refused at load, by name;
    every analysis script a shipped table uses takes ``--user-dir``."""
    import glob
    import subprocess

    user = tmp_path / "my_attention"
    user.mkdir()
    analyses = [{"name": "zero", "script": "scripts/attention_zero_rate.py", "key": "mean"},
                {"name": "energy", "script": "scripts/eatt_energy.py", "key": "energy_scores_asic_pct"}]
    spec = _rela_table1_spec(tmp_path, 2, user_dir=str(user), analyses=analyses)
    for row in spec["rows"]:
        argv = run_table.experiment_argv(spec, row, seed=2)
        assert argv[argv.index("--user-dir") + 1] == str(user), argv
    for sub in ("plain", "rel", "bad"):
        (tmp_path / sub).mkdir()
    assert "--user-dir" not in run_table.experiment_argv(_rela_table1_spec(tmp_path / "plain", 1), spec["rows"][0])
    assert _rela_table1_spec(tmp_path / "rel", 1, user_dir="configs")["_user_dir"] == CONFIGS
    with pytest.raises(SystemExit, match="user_dir 'nowhere' is not a directory"):
        _rela_table1_spec(tmp_path / "bad", 1, user_dir="nowhere")
    # a finished row's analyses: each command carries the directory
    row = spec["rows"][0]
    rdir = run_table.run_dir(spec, row)
    os.makedirs(rdir)
    with open(os.path.join(rdir, "result.json"), "w") as f:
        json.dump({"status": "done", "data": {"prep_dir": "data-bin/multi30k_en_de"}}, f)
    calls = []
    monkeypatch.setattr(experiment, "run", lambda cmd, *a, **k: calls.append(cmd))
    run_table.run_analyses(spec, row)
    assert [c[1] for c in calls] == [os.path.join(ROOT, an["script"]) for an in analyses]
    assert all(c[-2:] == ["--user-dir", str(user)] for c in calls), calls
    scripts = sorted({an["script"] for path in glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True)
                      for an in (yaml.safe_load(open(path)) or {}).get("analyses") or []
                      if isinstance(an, dict)})
    assert len(scripts) >= 5, scripts
    for script in scripts:
        helped = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                                cwd=ROOT, timeout=300)
        assert helped.returncode == 0 and "--user-dir" in helped.stdout, (script, helped.stderr[-1000:])


def test_render_shows_finished_rows_and_marks_divergence(tmp_path):
    spec = _rela_table1_spec(tmp_path, 3, metrics=["attn_entropy"])

    def result(valid_loss):
        return {"name": "x", "status": "done", "arch": "a", "attention_fns": "arch default",
                "commands": {"train": "fairseq-train ..."}, "git_commit": "abc", "hardware": {"cpu": "c"},
                "data": {"corpus": "multi30k"}, "updates": 400, "time": "t",
                "wall_s": {"train_fairseq_cumulative": 120.0}, "loss_curve": [[10, 9.0]],
                "valid_loss": [[400, valid_loss]], "valid_last": {"attn_entropy": 1.5},
                "scores": {s: {"bleu": 21.5, "tok_bleu": 22.0, "signature": "nrefs:1|sig"}
                           for s in ("test", "test1")}}

    for rid, loss in ((1, 5.0), (2, float("nan"))):
        d = tmp_path / "runs" / f"row{rid}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(result(loss)))
    run_table.render(spec)
    text = (tmp_path / "out.md").read_text()
    rows = [l for l in text.splitlines() if l.startswith("| ")]
    assert "21.50 (22.00)" in rows[1] and "1.500" in rows[1] and "2.0 min" in rows[1]
    assert "| – | – |" in rows[2] and "failed: diverged (final validation loss nan)" in rows[2]
    assert "not run yet" in rows[3]
    assert "nrefs:1|sig" in text


def test_a_first_row_whose_training_failed_renders_with_its_reason(tmp_path):
    """Issue 29 item 3: a failed run records no scores and no data; the table still renders (it
    crashed with KeyError 'data'), the row shows "–" and why, and `--retry-failed` runs it again."""
    spec = _rela_table1_spec(tmp_path, 2)
    d = tmp_path / "runs" / "row1"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({
        "name": "x", "status": "failed", "error_tail": ["...", "ValueError: Sentence at index 3 exceeds max_tokens"],
        "arch": "a", "attention_fns": None, "commands": {"train": "fairseq-train ..."}, "git_commit": "abc",
        "hardware": {"cpu": "c"}, "loss_curve": [], "valid_loss": [], "updates": 0, "wall_s": {}, "scores": {},
        "time": "t"}))
    run_table.render(spec)
    rows = [l for l in (tmp_path / "out.md").read_text().splitlines() if l.startswith("| 1 |")]
    assert "| – | – |" in rows[0] and "failed: training stopped with an error: ValueError: Sentence at index 3" in rows[0]
    moved = run_table.retire_failed(str(d))
    assert moved and os.path.basename(moved).startswith("result.failed-") and not (d / "result.json").exists()
    assert run_table.retire_failed(str(d)) is None  # nothing failed left to retire


def test_render_reads_the_seed_of_runs_that_record_it_only_in_their_budget(tmp_path):
    """Runs made before ``result.json`` had a ``seed`` key name their seed through the budget."""
    spec = _rela_table1_spec(tmp_path, 1)
    d = tmp_path / "runs" / "row1"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({
        "name": "x", "status": "done", "arch": "a", "attention_fns": "arch default",
        "commands": {"train": "fairseq-train ..."}, "git_commit": "abc", "hardware": {"cpu": "c"},
        "data": {"corpus": "multi30k"}, "updates": 400, "time": "t", "wall_s": {},
        "config": {"train": {"seed": 7}}, "valid_loss": [[400, 5.0]], "loss_curve": [[10, 9.0]],
        "scores": {s: {"bleu": 21.5, "tok_bleu": 22.0, "signature": "nrefs:1|sig"} for s in ("test", "test1")}}))
    run_table.render(spec)
    text = (tmp_path / "out.md").read_text()
    assert "Seeds: 7 (1 per row" in text and "(seed 7)" in text and "Seeds: ?" not in text


def _finished_rows(tmp_path, ref_path, refs, hyps_by_row):
    """A finished ``result.json`` with real sacreBLEU scores of ``hyps_by_row[id]`` against
    ``refs`` under ``tmp_path/runs/row<id>``, for each row."""
    import sacrebleu

    for rid, hyps in hyps_by_row.items():
        d = tmp_path / "runs" / f"row{rid}"
        d.mkdir(parents=True)
        (d / "hyp.txt").write_text("\n".join(hyps) + "\n")
        (d / "result.json").write_text(json.dumps({
            "name": "x", "status": "done", "arch": "a", "attention_fns": "arch default",
            "commands": {"train": "fairseq-train ..."}, "git_commit": "abc", "hardware": {"cpu": "c"},
            "data": {"corpus": "multi30k"}, "updates": 400, "time": "t", "wall_s": {}, "seed": 1,
            "valid_loss": [[400, 5.0]], "loss_curve": [[10, 9.0]],
            "scores": {s: {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score, "tok_bleu": 22.0, "chrf": 50.0,
                           "signature": "nrefs:1|sig", "hyp": str(d / "hyp.txt"), "ref": str(ref_path)}
                       for s in ("test", "test1")}}))


def test_render_tests_every_row_against_each_listed_reference(tmp_path):
    """``reference: [1, 2]``: one ``vs row R`` column per reference, each a real paired bootstrap
    of the committed hypotheses (a study's baseline *and* its zero setting, e.g. λ = 0)."""
    refs = [f"the cat number {i} sat on the mat today" for i in range(120)]
    bad = [r if i % 3 else "a dog" for i, r in enumerate(refs)]
    ref_path = tmp_path / "ref.txt"
    ref_path.write_text("\n".join(refs) + "\n")
    spec = _rela_table1_spec(tmp_path, 3, reference=[1, 2])
    _finished_rows(tmp_path, ref_path, refs, {1: refs, 2: bad, 3: refs})
    run_table.render(spec)
    text = (tmp_path / "out.md").read_text()
    header, *rows = [[c.strip() for c in l.strip().strip("|").split("|")]
                     for l in text.splitlines() if l.startswith("| ")]
    c1, c2 = header.index(f"vs row 1 ({spec['subsets']['test']})"), header.index(f"vs row 2 ({spec['subsets']['test']})")
    assert rows[0][c1] == "reference" and rows[1][c2] == "reference"
    assert rows[1][c1].startswith("1 seed: Δ -") and rows[0][c2].startswith("1 seed: Δ +")  # bad < good, both ways
    assert rows[2][c1].startswith("1 seed: Δ +0.00, p = 1.000") and rows[2][c2].startswith("1 seed: Δ +")
    assert "`vs row 1`: difference to row 1" in text and "`vs row 2`: difference to row 2" in text


def test_a_row_tested_against_its_own_reference(tmp_path):
    """A row's ``vs`` (e.g. the ReLU row of the same FFN size in a sweep) fills one ``vs its
    reference`` column: "row R: <verdict>", "reference" on the rows others are tested against;
    ``reference: []`` drops the table-wide columns."""
    refs = [f"the cat number {i} sat on the mat today" for i in range(120)]
    bad = [r if i % 3 else "a dog" for i, r in enumerate(refs)]
    ref_path = tmp_path / "ref.txt"
    ref_path.write_text("\n".join(refs) + "\n")
    spec = yaml.safe_load(open(os.path.join(CONFIGS, "rela", "table1.yaml")))
    spec.update(out=str(tmp_path / "out.md"), runs=str(tmp_path / "runs"), reference=[])
    spec["rows"] = spec["rows"][:3]
    spec["rows"][2]["vs"] = 2
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec))
    spec = run_table.load_table(str(path))
    _finished_rows(tmp_path, ref_path, refs, {1: refs, 2: refs, 3: bad})
    run_table.render(spec)
    text = (tmp_path / "out.md").read_text()
    header, *rows = [[c.strip() for c in l.strip().strip("|").split("|")]
                     for l in text.splitlines() if l.startswith("| ")]
    assert not any(h.startswith("vs row") for h in header)
    c = header.index(f"vs its reference ({spec['subsets']['test']})")
    assert [r[c] for r in rows[:2]] == ["", "reference"]
    assert rows[2][c].startswith("row 2: 1 seed: Δ -")
    assert "`vs its reference`: difference to the row named in the cell" in text
    for bad_vs in (3, 9):  # itself, not a row
        spec_bad = yaml.safe_load(path.read_text())
        spec_bad["rows"][2]["vs"] = bad_vs
        path.write_text(yaml.safe_dump(spec_bad))
        with pytest.raises(SystemExit, match="rows \\[3\\] name a `vs` that is not another row's id; valid: \\[1, 2, 3\\]"):
            run_table.load_table(str(path))


@pytest.mark.parametrize("reference,match", [(9, "not row ids: \\[9\\]"), ([1, 1], "repeated ids")])
def test_a_reference_that_is_not_a_distinct_row_id_is_rejected_naming_the_ids(tmp_path, reference, match):
    with pytest.raises(SystemExit, match=match + ".*valid: \\[1, 2\\]"):
        _rela_table1_spec(tmp_path, 2, reference=reference)


def test_provenance_line_names_every_training_invocation():
    """A page's provenance shows each start / resume of fairseq-train: its code (with the diff of a
    +dirty tree), machine, update span and outcome; a killed invocation ends where the next resumed."""
    cpu = {"cpu": "AMD EPYC", "cores": 2, "torch_threads": 2, "accelerator": "cpu only"}
    res = {"train_invocations": [
        {"n": 1, "git_commit": "a" * 40 + "+dirty", "hardware": cpu, "started": "2026-11-30 06:34:32",
         "updates_at_start": 0, "diff": "results/runs/converged/x/row3/dirty-1.diff.gz"},
        {"n": 2, "git_commit": "b" * 40, "hardware": {"accelerator": "NVIDIA H200"}, "started": "2026-11-30 09:00:00",
         "updates_at_start": 1850, "updates_at_end": 3000, "outcome": "done", "wall_s": 412.4}]}
    line = run_table.invocations_line(res)
    first, second = line.split("; #2 ")
    assert first.startswith("- training invocations: #1 `aaaaaaaaaaaa`, diff `results/runs/converged/x/row3/dirty-1.diff.gz`")
    assert "AMD EPYC, 2 cores, 2 torch threads" in first and "updates 0 -> ?" in first
    assert "resumed from its checkpoint at update 1850" in first
    assert "NVIDIA H200" in second and "updates 1850 -> 3000, done, 412 s" in second
    assert run_table.invocations_line({"git_commit": "c" * 40}) is None  # recorded before train_invocations


def test_provenance_line_names_the_committed_diff_wherever_the_record_was_read(tmp_path):
    """A run read from its run directory records its own ``dirty-1.diff`` (git-ignored); once the
    evidence holds ``dirty-1.diff.gz``, the page names that one, as it does when read from the
    evidence -- the page does not depend on whether the run directory is still on this machine."""
    ev = tmp_path / "results" / "runs" / "converged" / "t" / "row3"
    ev.mkdir(parents=True)
    res = {"train_invocations": [{"n": 1, "git_commit": "a" * 40 + "+dirty", "updates_at_start": 0,
                                  "updates_at_end": 10, "outcome": "done", "diff": "runs/converged/t/row3/dirty-1.diff"}]}
    assert "diff `runs/converged/t/row3/dirty-1.diff`" in run_table.invocations_line(res, str(ev))  # not exported
    (ev / "dirty-1.diff.gz").write_bytes(b"")
    line = run_table.invocations_line(res, str(ev))
    assert f"diff `{os.path.relpath(ev / 'dirty-1.diff.gz', run_table.ROOT)}`" in line, line
    res["train_invocations"][0]["diff"] = os.path.relpath(ev / "dirty-1.diff.gz", run_table.ROOT)  # read from it
    assert run_table.invocations_line(res, str(ev)) == line
