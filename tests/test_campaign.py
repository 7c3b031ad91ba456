"""mt-campaign (issue 26): plans of table rows × seeds run by a local launcher (CPU, niced, killed and
resumed) and by submitit's local executor, evidence exported and re-scored, failing rows rendered with
their reason, ``--minutes`` refusing runs that cannot finish, and the verdict rule of the results page.

Real data: the 3,000-pair Multi30k slice and the tiny budget of tests/test_pipeline_faults.py (a
1+1-layer d-16 model, 8 updates, greedy search with short outputs).  Evidence goes to a temporary
``$MT_EVIDENCE_ROOT``, never into the repository's ``results/``.
"""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

import train_helpers as th
from test_end_to_end import RAW, prepared  # noqa: F401  (module fixture: the prepared Multi30k slice)
from test_pipeline_faults import MODEL, budget  # noqa: F401  (module fixture: the tiny budget)

from mt_pipeline import campaign, evidence
from mt_pipeline import tables as run_table

needs_data = pytest.mark.skipif(not os.path.isdir(RAW), reason=f"real data not found at {RAW}")


def _spec(tmp_path, budget, rows, name="tiny"):  # noqa: F811
    spec = {"title": name, "out": str(tmp_path / f"{name}.md"), "runs": str(tmp_path / "runs" / name),
            "budget": budget, "src": "en", "tgt": "de", "subsets": {"test": "test2016"}, "paper_label": "paper",
            "rows": rows}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return str(path)


ROW_SOFTMAX = {"id": 1, "name": "softmax", "arch": "rela_transformer_small", "fns": ["softmax"] * 3, "extra": MODEL}
ROW_RELA = {"id": 3, "name": "ReLA-g", "arch": "rela_transformer_small", "fns": ["rela_g", "rela_g", "softmax"],
            "extra": MODEL}
# fails in training, not at start-up: no Multi30k sentence fits into 5 tokens
ROW_FAILS = {"id": 2, "name": "fails", "arch": "rela_transformer_small", "fns": ["softmax"] * 3,
             "extra": MODEL + " --max-tokens 5"}


def _plan(tmp_path, budget, table, rows, seeds=(1,), name="plan.yaml", claims=None):  # noqa: F811
    plan = {"title": "tiny plan", "budget": budget, "runs": [{"table": table, "rows": list(rows), "seeds": list(seeds)}]}
    if claims:
        plan["claims"] = claims
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plan))
    return str(path)


def _env(tmp_path):
    env = th.env()
    env["MT_EVIDENCE_ROOT"] = str(tmp_path / "evidence")
    return env


def _campaign(args, tmp_path, check=True, timeout=900):
    if args[:1] == ["run"] and "--nice" not in args:
        # not the default nice 10: the run's session would get ~a tenth of a core against the
        # other pytest worker (test 1 below checks that --nice reaches the run)
        args = [*args, "--nice", "0"]
    res = subprocess.run([sys.executable, "-m", "mt_pipeline.campaign", *args], cwd=th.ROOT, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=timeout)
    out = res.stdout + res.stderr
    if check:
        assert res.returncode == 0, out[-4000:]
    return res.returncode, out


def _status(plan, tmp_path):
    """``mt-campaign status --json``: the JSON on stdout (fairseq's import logging goes to stderr)."""
    res = subprocess.run([sys.executable, "-m", "mt_pipeline.campaign", "status", "--plan", plan, "--json"],
                         cwd=th.ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {r["key"]: r for r in json.loads(res.stdout)}


def _niceness(token):
    """``(niceness, autogroup niceness or None)`` of each live ``mt_pipeline.experiment`` process
    whose command line holds ``token`` (the second where the kernel groups sessions)."""
    found = []
    for pid in th.live_processes(b"\0mt_pipeline.experiment\0", token):
        try:
            with open(f"/proc/{pid}/stat") as f:
                nice = int(f.read().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(f"/proc/{pid}/autogroup") as f:  # "/autogroup-N nice K"
                group = int(f.read().split()[-1])
        except (OSError, ValueError, IndexError):
            group = None
        found.append((nice, group))
    return found


# The kill below must land while fairseq-train is still training: with the tiny budget's 8 updates
# (~25 ms each) the first checkpoint_last.pt can appear after the last update, and the "resume" then
# only skips a finished training (CI failed once that way).  This test trains 120 updates with a
# checkpoint every 30, so ~90 updates (seconds) remain after the first checkpoint_last.pt.
KILL_UPDATES = 120


def _kill_budget(tmp_path, budget):  # noqa: F811
    path = tmp_path / "kill_budget.yaml"
    path.write_text(yaml.safe_dump({"base": budget, "train": {"max-update": KILL_UPDATES, "save-interval-updates": 30}}))
    return str(path)


@needs_data
def test_local_launcher_runs_a_plan_killed_resumed_failing_row_and_minutes(budget, tmp_path, monkeypatch):  # noqa: F811
    budget = _kill_budget(tmp_path, budget)
    table = _spec(tmp_path, budget, [ROW_SOFTMAX, ROW_FAILS])
    plan = _plan(tmp_path, budget, table, [1, 2])
    row1 = tmp_path / "runs" / "tiny" / "smoke" / "row1"   # an absolute runs/<table>/rowN: .../<regime>/rowN
    st = _status(plan, tmp_path)
    assert [r["state"] for r in st.values()] == ["pending", "pending"]

    # 1. start in the background (niced: 1, to keep its share of the cores beside the other pytest
    # worker), kill (TERM) once row 1 has a checkpoint: the run stops with it
    proc = subprocess.Popen([sys.executable, "-m", "mt_pipeline.campaign", "run", "--plan", plan, "--nice", "1"],
                            cwd=th.ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    ckpt = row1 / "checkpoints" / "checkpoint_last.pt"
    deadline = time.time() + 600
    while proc.poll() is None and not ckpt.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, "the campaign finished before it could be killed:\n" + proc.communicate()[0][-3000:]
    # the run (python -m mt_pipeline.experiment --out <row1>) is niced by 1 more than this process,
    # and its session's autogroup (written as an absolute value) to 1 where this process is in an
    # autogroup (the file reads "/autogroup-N nice K"; it reads empty where autogroups are off or the
    # process sits in another cgroup, as on the CI machine) and the kernel lets a process set its
    # autogroup's niceness (probed by writing ours back unchanged)
    [(nice, group)] = _niceness(str(row1))
    assert nice == min(19, os.nice(0) + 1)
    try:
        with open("/proc/self/autogroup") as f:
            mine = f.read().split()
        if mine:
            with open("/proc/self/autogroup", "w") as f:
                f.write(mine[-1])
            assert group == 1
    except OSError:
        pass
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert "signal 15: stopping 1 run(s)" in out, out[-3000:]
    assert not (row1 / "result.json").exists()
    killed_at = [l for l in (row1 / "train.log").read_text().splitlines() if " | train_inner | " in l or "done training" in l]
    assert not any("done training" in l for l in killed_at), "killed only after training had finished:\n" + out[-3000:]
    time.sleep(1)
    st = _status(plan, tmp_path)
    assert st["tiny row1 seed1"]["state"] == "partial" and st["tiny row2 seed1"]["state"] == "pending"
    assert subprocess.run(["pgrep", "-f", str(row1)], capture_output=True).returncode == 1  # nothing left running

    # 2. the re-run resumes row 1 from its checkpoint and runs row 2, which fails in training
    _, out = _campaign(["run", "--plan", plan], tmp_path)
    res1 = json.loads((row1 / "result.json").read_text())
    assert res1["status"] == "done" and res1["updates"] == KILL_UPDATES
    train_log = (row1 / "train.log").read_text()
    assert "Loaded checkpoint" in train_log and "@ 0 updates" not in train_log.split("Loaded checkpoint")[-1][:200]
    st = _status(plan, tmp_path)
    assert st["tiny row1 seed1"]["state"] == "done"
    failed = st["tiny row2 seed1"]
    assert failed["state"] == "failed" and failed["reason"].startswith("training stopped with an error")
    md = (tmp_path / "tiny_smoke.md").read_text()
    row_lines = [l for l in md.splitlines() if l.startswith("| 2 | fails")]
    assert row_lines and "failed: training stopped with an error" in row_lines[0], md
    assert "| 1 | softmax" in md and "| done |" in md
    assert "committed evidence (result.json, hypotheses, training log)" in md  # rendered from the run dir too

    # 3. evidence: result.json with committed hypotheses that re-score to the recorded BLEU
    ev = tmp_path / "evidence" / "smoke" / "tiny" / "smoke" / "row1"  # <regime>/<last three components>
    manifest = json.loads((ev / "MANIFEST.json").read_text())
    assert {"result.json", "test.hyp.detok.gz", "train.log.gz"} <= set(manifest["files"])
    assert manifest["git_commit"] == res1["git_commit"]  # every committed file names its commit
    exported = json.loads((ev / "result.json").read_text())
    assert exported["config"]["sha256"] == json.loads((row1 / "config.json").read_text())["sha256"]
    assert exported["campaign"]["launcher"] == "local"
    hyp = gzip.open(ev / "test.hyp.detok.gz", "rt", encoding="utf-8").read().splitlines()
    assert len(hyp) == 1000  # test_2016_flickr
    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    rescored = evidence.rescore(str(ev / "result.json"))
    assert rescored[0]["bleu"] == pytest.approx(res1["scores"]["test"]["bleu"], abs=0.005)
    # the table renders from the evidence alone once the run directory is gone (a fresh checkout)
    os.rename(row1, tmp_path / "moved_row1")
    st = _status(plan, tmp_path)
    assert st["tiny row1 seed1"]["state"] == "done" and "evidence" in st["tiny row1 seed1"]["where"]
    _campaign(["render", "--plan", plan], tmp_path)
    md = (tmp_path / "tiny_smoke.md").read_text()
    assert "committed evidence" in md and f"{res1['scores']['test']['bleu']:.2f}" in md
    os.rename(tmp_path / "moved_row1", row1)

    # 4. --minutes: a new seed of row 1 needs ~a run's time (measured above); 0.01 min is refused
    plan2 = _plan(tmp_path, budget, table, [1], seeds=[2], name="plan2.yaml")
    _, out = _campaign(["run", "--plan", plan2, "--minutes", "0.01"], tmp_path)
    assert "not starting tiny row1 seed2: needs ~" in out and "started 0 run(s)" in out
    assert not (tmp_path / "runs" / "tiny" / "smoke" / "row1-seed2" / "checkpoints").exists()
    # a failed run is not retried unless asked; --retry-failed keeps the failed record aside
    _, out = _campaign(["run", "--plan", plan, "--dry-run"], tmp_path)
    assert "row2" not in out
    _campaign(["run", "--plan", plan, "--retry-failed"], tmp_path)
    row2 = tmp_path / "runs" / "tiny" / "smoke" / "row2"
    assert [n for n in os.listdir(row2) if n.startswith("result.failed-")] and (row2 / "result.json").exists()


@needs_data
def test_submitit_launcher_runs_a_two_row_plan_with_the_local_executor(budget, tmp_path):  # noqa: F811
    pytest.importorskip("submitit")
    table = _spec(tmp_path, budget, [ROW_SOFTMAX, ROW_RELA], name="sub")
    plan = _plan(tmp_path, budget, table, [1, 3])
    _, out = _campaign(["run", "--plan", plan, "--launcher", "slurm", "--cluster", "local", "--timeout-min", "20"],
                       tmp_path)
    assert out.count("submitted sub row") == 2, out[-3000:]
    st = _status(plan, tmp_path)
    assert [r["state"] for r in st.values()] == ["done", "done"], st
    for rid in (1, 3):
        d = tmp_path / "runs" / "sub" / "smoke" / f"row{rid}"
        meta = json.loads((d / "campaign.json").read_text())
        assert meta["launcher"] == "slurm" and meta["cluster"] == "local" and meta["returncode"] == 0
        assert (tmp_path / "evidence" / "smoke" / "sub" / "smoke" / f"row{rid}" / "test.hyp.detok.gz").exists()
    assert "| 3 | ReLA-g" in (tmp_path / "sub_smoke.md").read_text()


def test_a_bad_plan_is_refused_before_anything_runs(tmp_path):
    good = {"budget": "configs/multi30k/converged.yaml",
            "runs": [{"table": "configs/rela/table1.yaml", "rows": [1, 7], "seeds": [1]}]}

    def refused(plan, *words):
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(plan, allow_unicode=True))
        with pytest.raises(SystemExit) as err:
            campaign.load_plan(str(path))
        for w in words:
            assert w in str(err.value), str(err.value)

    refused(dict(good, budgte="x"), "unknown keys", "did you mean 'budget'")
    refused({**good, "runs": [{"table": "configs/rela/table1.yaml", "rows": [99]}]}, "[99]", "valid: [1, 2")
    refused({**good, "runs": [{"table": "configs/rela/table1.yaml", "rows": [1], "seeds": [0]}]}, "positive integers")
    refused({**good, "runs": [{"table": "configs/rela/nope.yaml", "rows": [1]}]}, "table spec not found")
    with pytest.raises(SystemExit) as err:  # a plan that is not there: the plans that are
        campaign.load_plan("configs/campaign/nope.yaml")
    assert "campaign plan not found" in str(err.value) and "configs/campaign/smoke.yaml" in str(err.value)
    refused({**good, "claims": [{"id": "x", "claim": "c", "table": "configs/rela/table1.yaml", "row": 7, "vs": 1,
                                 "expect": "same"}]}, "'same' is not one of ['equal', 'better', 'worse']")
    refused({**good, "claims": [{"id": "x", "claim": "c", "table": "configs/eatt/table4_multi30k.yaml", "row": 2,
                                 "vs": 1, "expect": "equal"}]}, "is not run by the plan")
    # the real plan loads, expands seed-major and trains a run shared by two tables once
    plan = campaign.load_plan(campaign.DEFAULT_PLAN)
    keys = [r.key for r in plan["_runs"]]
    assert keys[:4] == ["rela_table1 row1 seed1", "rela_table1 row7 seed1", "rela_table1 row1 seed2",
                        "rela_table1 row7 seed2"]
    assert len(set(r.dir for r in plan["_runs"])) == len(keys)
    shared = next(r for r in plan["_runs"] if r.key == "rela_table1 row1 seed1")
    assert "configs/eatt/table4_multi30k.yaml" in shared.tables
    assert all(r.regime == "converged" for r in plan["_runs"])
    refused({"runs": good["runs"][:0]}, "'runs' must be a non-empty list")
    refused(dict(good, section="two words"), "section 'two words' must be a name of letters")
    # a tagged budget is for runs under --budget / a plan's budget: as a table's own budget its runs would
    # land in the regime's directories; and a budget built on it does not inherit its tag
    spec = yaml.safe_load(open(os.path.join(th.ROOT, "configs", "rela", "table1.yaml")))
    spec["budget"] = "configs/multi30k/converged_6k.yaml"
    (tmp_path / "t6k.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    with pytest.raises(SystemExit) as err:
        run_table.load_table(str(tmp_path / "t6k.yaml"))
    assert "whose tag 'converged_6k' names the directories of tables run under it with --budget" in str(err.value)
    (tmp_path / "b9k.yaml").write_text("base: configs/multi30k/converged_6k.yaml\ntrain: {max-update: 9000}\n")
    from mt_pipeline.budget import load_budget, run_tag
    assert run_tag(load_budget(str(tmp_path / "b9k.yaml"))) == "converged"
    # the budget check plan: the converged claims at 6,000 updates, in their own directories and block
    long = campaign.load_plan("configs/campaign/converged_6k.yaml")
    assert {c["id"] for c in long["claims"]} == {c["id"] + "-6k" for c in plan["claims"]}
    assert all(r.regime == "converged" and r.target_updates == 6000 and
               r.dir.startswith(os.path.join(th.ROOT, "runs", "converged_6k") + os.sep) for r in long["_runs"])
    assert not {r.dir for r in long["_runs"]} & {r.dir for r in plan["_runs"]}
    assert campaign.markers(long) == ("<!-- mt-campaign:begin converged_6k -->", "<!-- mt-campaign:end converged_6k -->")
    refused({"title": "t"}, "missing key 'runs'")
    # without `budget:` every table trains under its own budget(s): the smoke plans, in the tables'
    # own run directories (runs/<table>/row<id>), the regime and target of each row's budget
    smoke = campaign.load_plan("configs/campaign/smoke.yaml")
    by_key = {r.key: r for r in smoke["_runs"]}
    row1 = by_key["rela_table1 row1 seed1"]
    assert row1.dir == os.path.join(th.ROOT, "runs", "rela_table1", "row1") and row1.regime == "smoke"
    assert row1.budget.endswith("configs/multi30k/small_cpu.yaml") and row1.target_updates == 400
    assert by_key["reluformer_lambda_study row1 seed1"].regime == "diagnostic"
    assert "configs/eatt/table4_multi30k.yaml" in row1.tables  # E-ATT T4 row 1 is this run
    assert len(set(r.dir for r in smoke["_runs"])) == len(smoke["_runs"])
    long_docs = [r for r in smoke["_runs"] if r.key.startswith("reluformer_table6 ")]
    assert len(long_docs) == 13 and len({r.budget for r in long_docs}) == 5  # own budgets (L128 ... L2048)
    assert all(r.dir == os.path.join(th.ROOT, "runs", "reluformer_table6", r.key.split()[1]) for r in long_docs)


def _fake_run(d, bleu_hyp, ref_path, seed, tmp_path):
    """A finished run directory whose hypotheses are ``bleu_hyp`` (lines) scored against ``ref_path``."""
    from mt_pipeline.scoring import score_files

    os.makedirs(d / "eval", exist_ok=True)
    hyp = d / "eval" / "test.hyp.detok"
    hyp.write_text("\n".join(bleu_hyp) + "\n")
    score = score_files(str(hyp), str(ref_path))
    res = {"name": d.name, "status": "done", "seed": seed, "updates": 10, "scores": {"test": score},
           "valid_loss": [[10, 3.0]], "wall_s": {"train_fairseq_cumulative": 20.0, "evaluate": 4.0},
           "git_commit": "x", "hardware": {"accelerator": "cpu only", "cpu": "c", "cores": 2}, "time": "t",
           "attention_fns": None, "commands": {"train": "t"}, "config": {"budget_file": "b"}, "loss_curve": [[10, 3.0]]}
    (d / "result.json").write_text(json.dumps(res))
    return score["bleu"]


def _verdict_table(tmp_path, refs, names):
    """Write ``refs`` (the test set's reference lines) to ``tmp_path/ref.txt`` and a table spec
    ``tmp_path/t.yaml`` under a converged budget whose rows 1, 2, ... are ``names``; returns
    ``(reference path, budget path)``."""
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(refs) + "\n")
    budget_path = tmp_path / "conv.yaml"
    budget_path.write_text(yaml.safe_dump({"base": "configs/multi30k/converged.yaml", "data": {"subsets": ["test"]}}))
    spec = {"title": "t", "out": str(tmp_path / "t.md"), "runs": str(tmp_path / "runs" / "t"), "budget": str(budget_path),
            "src": "en", "tgt": "de", "subsets": {"test": "test2016"}, "paper_label": "paper",
            "rows": [{"id": i, "name": n, "arch": "a"} for i, n in enumerate(names, 1)]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    return ref, budget_path


def test_claim_verdicts_follow_the_rule_of_the_results_page(tmp_path, monkeypatch):
    """A claim is "reproduced"/"not reproduced" only with the converged budget and 3 seeds; with
    fewer it is "not tested yet" with the direction so far.  A "matches" claim's interval adds the
    test set's sampling noise of the seed-mean Δ to the seeds' standard error."""
    import random

    rng = random.Random(0)
    words = "a man in a blue shirt is riding a red bike down the street while two dogs watch".split()
    refs = [" ".join(rng.sample(words, 8)) for _ in range(300)]
    ref, budget_path = _verdict_table(tmp_path, refs, ["base", "same", "worse"])

    def degrade(lines, frac, r):
        return [" ".join(w if r.random() > frac else "x" for w in l.split()) for l in lines]

    claims = [{"id": "eq", "claim": "row 2 matches row 1", "table": str(tmp_path / "t.yaml"), "row": 2, "vs": 1,
               "expect": "equal", "margin": 8.0},
              {"id": "worse", "claim": "row 3 is worse", "table": str(tmp_path / "t.yaml"), "row": 3, "vs": 1,
               "expect": "worse"},
              {"id": "better", "claim": "row 3 is better", "table": str(tmp_path / "t.yaml"), "row": 3, "vs": 1,
               "expect": "better"}]
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump({"budget": str(budget_path), "claims": claims,
                                         "runs": [{"table": str(tmp_path / "t.yaml"), "rows": [1, 2, 3],
                                                   "seeds": [1, 2, 3]}]}))
    plan = campaign.load_plan(str(plan_path))
    assert campaign.claim_verdict(plan, claims[0])["verdict"] == "not tested yet (0/3 seeds)"
    by_key = {r.key: r for r in plan["_runs"]}
    for seed in (1, 2, 3):
        r = random.Random(seed)
        for rid, frac in ((1, 0.10), (2, 0.10), (3, 0.45)):
            run = by_key[f"t row{rid} seed{seed}"]
            os.makedirs(run.dir, exist_ok=True)
            hyp = degrade(refs, frac + r.uniform(-0.01, 0.01), r)
            _fake_run(__import__("pathlib").Path(run.dir), hyp, ref, seed, tmp_path)
        if seed == 1:
            v = campaign.claim_verdict(plan, claims[1])
            assert v["verdict"].startswith("not tested yet (1/3 seeds, converged): so far worse"), v
    v_eq, v_worse, v_better = (campaign.claim_verdict(plan, c) for c in claims)
    assert v_eq["verdict"].startswith("reproduced: equivalent within ±8 BLEU"), v_eq
    assert v_worse["verdict"].startswith("reproduced: worse beyond seed noise"), v_worse
    assert v_better["verdict"].startswith("not reproduced: the opposite direction"), v_better
    # no difference found is not equivalence: a margin tighter than the seed noise is inconclusive,
    # and rows 10 BLEU-ish apart are not equivalent
    tight = dict(claims[0], margin=0.01)
    assert campaign.claim_verdict(plan, tight)["verdict"].startswith("inconclusive: neither equivalent"), tight
    far = dict(claims[1], expect="equal")
    v_far = campaign.claim_verdict(plan, far)["verdict"]
    assert v_far.startswith("not reproduced: differs by more than 1 BLEU"), v_far
    # the equivalence interval: SE = √(SE seeds² + sd test set²), the latter the joint bootstrap's
    import re
    delta, two_se = map(float, re.search(r"\(Δ ([-+][\d.]+) ± ([\d.]+)", v_far).groups())  # seeds only
    lo, hi, se_tot, se_seeds, sd_test = map(float, re.search(
        r"; Δ ± 2 SE \(seeds and test set\): \[([-\d.]+), ([-\d.]+)\], SE ([\d.]+) = √\(([\d.]+)² seeds \+ "
        r"([\d.]+)² test set\)", v_far).groups())
    assert se_seeds == pytest.approx(two_se / 2, abs=0.006) and sd_test > 0.1
    assert se_tot == pytest.approx((se_seeds ** 2 + sd_test ** 2) ** 0.5, abs=0.006)
    assert (lo + hi) / 2 == pytest.approx(delta, abs=0.006) and (hi - lo) / 2 == pytest.approx(2 * se_tot, abs=0.02)
    two_tot = 2 * se_tot
    # a difference beyond seed noise whose Δ ± 2 SE straddles the margin is not non-equivalence
    straddle = dict(far, margin=abs(delta) - two_tot / 2)  # |Δ| - 2 SE < margin < |Δ|
    v_st = campaign.claim_verdict(plan, straddle)["verdict"]
    assert v_st.startswith("inconclusive: worse beyond seed noise, but Δ ± 2 SE (seeds and test set) reaches "
                           "inside"), v_st
    assert campaign.claim_verdict(plan, dict(far, margin=abs(delta) - 1.5 * two_tot))["verdict"].startswith(
        "not reproduced: differs by more than")
    # the test set's noise decides: a margin that Δ ± 2 SE (seeds only) would clear but Δ ± 2 SE (seeds and
    # test set) reaches is inconclusive -- and "not reproduced" without the test-set sd
    between = dict(far, margin=abs(delta) - (two_se + two_tot) / 2)
    v_between = campaign.claim_verdict(plan, between)["verdict"]
    assert v_between.startswith("inconclusive: worse beyond seed noise, but Δ ± 2 SE (seeds and test set)"), v_between
    real = campaign._test_set_sd
    monkeypatch.setattr(campaign, "_test_set_sd", lambda *a: dict(real(*a), sd=0.0))
    v_seeds_only = campaign.claim_verdict(plan, between)["verdict"]
    assert v_seeds_only.startswith("not reproduced: differs by more than"), v_seeds_only
    monkeypatch.setattr(campaign, "_test_set_sd", real)
    # 2 SE is the normal approximation: where a Welch t interval (3 + 3 seeds: t >= 2.78, i.e. >= 1.39
    # times the 2-SE half-width) reaches inside the margin and 2 SE does not, the verdict says so
    v_t = campaign.claim_verdict(plan, dict(far, margin=abs(delta) - 1.2 * two_tot))["verdict"]
    assert v_t.startswith("not reproduced: differs by more than"), v_t
    assert "; with a Welch t interval instead of 2 standard errors (ν = " in v_t and "it would be inconclusive" in v_t
    assert "Welch" not in v_far  # the same verdict either way: nothing added
    assert v_worse["seeds"] == 3
    assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d vs \d+\.\d\d ± \d+\.\d\d \(Δ [-+]\d+\.\d\d, 3 seeds, converged\)",
                        v_worse["ours"]), v_worse  # mean ± sd over seeds, both rows
    # runs on different compute (CPU fp32 beside GPU fp16) are named beside the numbers, by row and seed;
    # the table page's provenance lists each compute with its runs
    gpu_run = by_key["t row3 seed2"].dir
    res = json.loads(open(os.path.join(gpu_run, "result.json")).read())
    res["hardware"] = {"accelerator": "NVIDIA H200", "torch": "2.11.0+cu130"}
    res["commands"]["train"] = "fairseq-train bin --arch a --fp16"
    with open(os.path.join(gpu_run, "result.json"), "w") as f:
        json.dump(res, f)
    mixed = campaign.claim_verdict(plan, claims[1])
    assert mixed["verdict"] == v_worse["verdict"]
    assert mixed["ours"] == v_worse["ours"] + (
        "; mixed hardware: CPU (c, 2 cores), torch ?, fp32: row 3 seeds 1, 3 and row 1 seeds 1, 2, 3; "
        "NVIDIA H200, torch 2.11.0+cu130, fp16: row 3 seed 2"), mixed["ours"]
    assert "mixed" not in campaign.claim_verdict(plan, claims[0])["ours"]  # rows 1 and 2: all on one CPU
    # a run that recorded another budget (converged.yaml edited after it trained) is left out and named;
    # one that recorded the plan's budget (its own seed aside) still counts
    row3 = next(r for r in plan["_specs"][str(tmp_path / "t.yaml")]["rows"] if r["id"] == 3)
    for seed, max_update in ((1, row3["_budget"]["train"]["max-update"]), (2, 1000)):
        path = os.path.join(by_key[f"t row3 seed{seed}"].dir, "result.json")
        res = json.loads(open(path).read())
        budget = json.loads(json.dumps(row3["_budget"]))
        budget["train"].update({"max-update": max_update, "seed": seed})
        res["config"] = {"budget": budget}
        with open(path, "w") as f:
            json.dump(res, f)
    assert campaign.other_budget(json.loads(open(os.path.join(by_key["t row3 seed1"].dir, "result.json")).read()),
                                 row3) is None
    stale = campaign.claim_verdict(plan, claims[1])
    assert stale["seeds"] == 2 and stale["verdict"].startswith("not tested yet (2/3 seeds, converged)"), stale
    assert stale["ours"].endswith("(left out: row 3 row3-seed2: trained under another budget (train.max-update "
                                  "differ))"), stale["ours"]
    res = json.loads(open(os.path.join(gpu_run, "result.json")).read())
    del res["config"]
    with open(os.path.join(gpu_run, "result.json"), "w") as f:
        json.dump(res, f)
    spec_rows = plan["_specs"][str(tmp_path / "t.yaml")]["rows"]
    results = {r["id"]: run_table.row_results(plan["_specs"][str(tmp_path / "t.yaml")], r) for r in spec_rows}
    lines = run_table.hardware_lines(spec_rows, results)
    assert lines[0].startswith("- hardware: **mixed**") and len(lines) == 3, lines
    assert lines[2] == "  - NVIDIA H200, torch 2.11.0+cu130, fp16: row 3 seed 2", lines
    assert run_table.hardware_lines(spec_rows[:2], results) == ["- hardware: CPU (c, 2 cores), torch ?, fp32"]
    # the verdicts land between the page's markers, and a second render replaces them
    page = tmp_path / "README.md"
    page.write_text(f"# Results\n\nintro\n\n{campaign.BEGIN}\nold\n{campaign.END}\n\nafter\n")
    campaign.render_verdicts(plan, str(page))
    campaign.render_verdicts(plan, str(page))
    text = page.read_text()
    assert text.count(campaign.BEGIN) == 1 and "old" not in text and text.endswith("after\n")
    # a second plan with a `section` (e.g. the same claims at twice the budget) gets its own block,
    # right after the first plan's, and its renders never touch the first block
    long_plan = dict(plan, section="twice", title="Twice the budget")
    begin, end = campaign.markers(long_plan)
    assert (begin, end) == ("<!-- mt-campaign:begin twice -->", "<!-- mt-campaign:end twice -->")
    campaign.render_verdicts(long_plan, str(page))
    campaign.render_verdicts(long_plan, str(page))
    both = page.read_text()
    assert both.count(begin) == 1 and both.count(campaign.BEGIN) == 1 and both.endswith("after\n")
    assert both.index(campaign.END) < both.index(begin) < both.index(end) < both.index("after")
    assert "### Twice the budget: verdicts" in both and both.split(campaign.BEGIN)[1].split(campaign.END)[0] == \
        text.split(campaign.BEGIN)[1].split(campaign.END)[0]
    campaign.render_verdicts(plan, str(page))
    assert page.read_text() == both
    assert "| row 3 is worse |" in text and "reproduced: worse beyond seed noise" in text
    # the rule says what the p is and which standard error each test uses
    assert "one-sided in effect" in text and "equivalence test on Δ ± 2 SE (seeds and test set)" in text
    assert "\"beyond seed noise\" = |Δ mean| > 2 standard errors over seeds" in text
    assert "| training logs missing |" in text and "Last column: the seed-mean difference of validation NLL" in text


def test_a_bootstrap_refuses_a_reference_that_is_not_the_one_scored(tmp_path, monkeypatch):
    """A review's probe: the paired bootstrap read whatever file the record's ``ref`` path held now
    (data prepared again, another machine's data) and paired it with hypotheses scored against
    another text; it must check the recorded ``ref_sha256`` and the verdict must say why it cannot test."""
    import pathlib

    from mt_pipeline.provenance import file_sha256

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    words = "a man in a blue shirt is riding a red bike".split()
    refs = [" ".join(words[i % 5:i % 5 + 5]) for i in range(60)]
    ref, budget_path = _verdict_table(tmp_path, refs, ["base", "other"])
    claim = {"id": "c", "claim": "row 2 is worse", "table": str(tmp_path / "t.yaml"), "row": 2, "vs": 1,
             "expect": "worse"}
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump({"budget": str(budget_path), "claims": [claim],
                                         "runs": [{"table": str(tmp_path / "t.yaml"), "rows": [1, 2], "seeds": [1]}]}))
    plan = campaign.load_plan(str(plan_path))
    runs = {r.key: r for r in plan["_runs"]}
    for rid, hyp in ((1, refs), (2, [l.replace("man", "dog") for l in refs])):
        d = pathlib.Path(runs[f"t row{rid} seed1"].dir)
        os.makedirs(d, exist_ok=True)
        _fake_run(d, hyp, ref, 1, tmp_path)
        res = json.loads((d / "result.json").read_text())
        res["scores"]["test"]["ref_sha256"] = file_sha256(str(ref))  # as evidence.export records it
        (d / "result.json").write_text(json.dumps(res))
    spec_l = plan["_specs"][str(tmp_path / "t.yaml")]
    by_id = {r["id"]: run_table.row_results(spec_l, r)[0] for r in spec_l["rows"]}
    assert run_table._significance(by_id[1], by_id[2], "test")["bleu_p"] < 0.05  # the scored reference: fine
    assert campaign.claim_verdict(plan, claim)["verdict"].startswith("not tested yet (1/3 seeds, converged)")
    for d in (runs["t row1 seed1"].dir, runs["t row2 seed1"].dir):  # the cache holds the first bootstrap
        if os.path.exists(os.path.join(d, "significance.json")):
            os.remove(os.path.join(d, "significance.json"))
    ref.write_text("\n".join(reversed(refs)) + "\n")  # prepared again: another text at the same path
    with pytest.raises(ValueError, match="differs from the one scored"):
        run_table._significance(by_id[1], by_id[2], "test")
    v = campaign.claim_verdict(plan, claim)
    assert v["verdict"].startswith("cannot test: reference ") and "differs from the one scored" in v["verdict"], v
    with pytest.raises(ValueError, match="differs from the one scored"):
        campaign._test_set_sd([by_id[1]], [by_id[2]], "test")


def _valid_log(path, nll, updates):
    """A fairseq JSON training log whose validations at ``updates`` report ``nll(u)`` as
    ``valid_nll_loss`` (``valid_loss`` 1 higher: label smoothing), gzipped by the path's suffix."""
    lines = "".join(f'2026 | INFO | valid | {{"epoch": {i + 1}, "valid_loss": "{nll(u) + 1:.6f}", '
                    f'"valid_nll_loss": "{nll(u):.6f}", "valid_num_updates": "{u}"}}\n'
                    for i, u in enumerate(updates))
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(lines)
    else:
        path.write_text(lines)


def test_gap_trend_says_whether_the_rows_drift_apart_or_together(tmp_path):
    """The verdict table's context column: the validation-NLL gap row - reference at a third, two
    thirds and the end of training (interpolated between validations that fall at different updates
    in the two runs), its slope over the last third, and "closing"/"widening" only when every seed
    agrees and the mean slope exceeds 2 standard errors."""
    ref_u = list(range(140, 3000, 140)) + [3000]
    row_u = list(range(150, 3000, 150)) + [3000]
    pairs = []
    for seed, wobble in ((1, 0.004), (2, -0.003), (3, 0.001)):
        row, ref = tmp_path / f"row{seed}", tmp_path / f"ref{seed}"
        row.mkdir(), ref.mkdir()
        # reference: 5 - u/1000; row: 0.3 - 0.06 u/1000 (+ a per-seed slope wobble) above it -> closing
        _valid_log(ref / "train.log.gz", lambda u: 5 - u / 1000, ref_u)
        _valid_log(row / "train.log", lambda u, w=wobble: 5 - u / 1000 + 0.3 - (0.06 + w) * u / 1000, row_u)
        pairs.append((str(row), str(ref)))
    t = campaign.gap_trend(pairs, 2, 1)
    assert t["cell"] == ("row 2 − row 1: +0.24, +0.18, +0.12 bits/token at 1,000 / 2,000 / 3,000 updates; "
                         "last third -0.061 per 1,000 updates, toward row 2 in 3 of 3 seeds: closing"), t
    assert [round(t["own"][os.path.abspath(r)], 6) for _, r in pairs] == [-1.0] * 3  # the references' own slope
    assert round(t["own"][os.path.abspath(pairs[0][0])], 6) == -1.064
    # the same gap seen from the other row: row 1 is ahead and row 2, behind, gains on it -> still closing
    flipped = campaign.gap_trend([(b, a) for a, b in pairs], 1, 2)
    assert flipped["cell"].startswith("row 1 − row 2: -0.24, -0.18, -0.12") and flipped["cell"].endswith(
        "toward row 2 in 3 of 3 seeds: closing"), flipped
    # a row ahead that pulls further ahead: widening, toward the row ahead
    for seed in (1, 2, 3):
        _valid_log(tmp_path / f"row{seed}" / "train.log", lambda u, s=seed: 5 - u / 1000 - (0.05 + 0.002 * s) * u / 1000,
                   row_u)
    wide = campaign.gap_trend(pairs, 2, 1)["cell"]
    assert wide.startswith("row 2 − row 1: -0.05, -0.11, -0.16") and wide.endswith(
        "toward row 2 in 3 of 3 seeds: widening"), wide
    for seed, wobble in ((1, 0.004), (2, -0.003), (3, 0.001)):  # back to the closing rows
        _valid_log(tmp_path / f"row{seed}" / "train.log",
                   lambda u, w=wobble: 5 - u / 1000 + 0.3 - (0.06 + w) * u / 1000, row_u)
    # a seed that trained longer is compared at the shortest run's updates, like the others
    _valid_log(tmp_path / "ref1" / "train.log.gz", lambda u: 5 - u / 1000, ref_u + [3140, 3280])
    _valid_log(tmp_path / "row1" / "train.log", lambda u: 5 - u / 1000 + 0.3 - 0.064 * u / 1000, row_u + [3150, 3300])
    assert campaign.gap_trend(pairs, 2, 1)["cell"] == t["cell"]
    # too few validations in the last third to fit a slope: said so, not "logs missing"
    _valid_log(tmp_path / "ref2" / "train.log.gz", lambda u: 5 - u / 1000, [150, 1000, 1500, 2500, 3000])
    assert campaign.gap_trend(pairs, 2, 1)["cell"].startswith("too few validations to compare")
    _valid_log(tmp_path / "ref2" / "train.log.gz", lambda u: 5 - u / 1000, ref_u)
    # a seed whose gap moves the other way: no direction claimed
    _valid_log(tmp_path / "row3" / "train.log", lambda u: 5 - u / 1000 + 0.1 + 0.05 * u / 1000, row_u)
    mixed = campaign.gap_trend(pairs, 2, 1)["cell"]
    assert "no consistent direction (toward row 2 in 2 of 3 seeds" in mixed, mixed
    # signs agree but the slopes scatter more than their mean: no direction either
    for seed, k in ((1, 0.001), (2, 0.3), (3, 0.002)):
        _valid_log(tmp_path / f"row{seed}" / "train.log", lambda u, k=k: 5 - u / 1000 + 0.3 - k * u / 1000, row_u)
    assert "no consistent direction (toward row 2 in 3 of 3 seeds, mean slope within" in campaign.gap_trend(
        pairs, 2, 1)["cell"]
    assert campaign.gap_trend(pairs[:1], 2, 1)["cell"].endswith("one seed: no direction claimed")
    os.remove(tmp_path / "ref2" / "train.log.gz")
    assert campaign.gap_trend(pairs, 2, 1) == {"cell": "training logs missing", "own": {}}


@pytest.mark.parametrize("path", evidence.committed_results() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no committed run evidence in results/runs yet"))])
def test_every_committed_run_rescores_from_its_hypotheses(path, tmp_path):
    """Every ``results/runs/**/result.json`` re-scores from its committed hypotheses to its
    recorded BLEU and chrF (the references come from mt-prep of the run's corpus, run up to the
    stage that writes them: ``--until``, as the message of a missing reference says)."""
    res = json.loads(open(path).read())
    refs = [evidence.resolve(s["ref"]) for s in res["scores"].values()]
    if not all(os.path.exists(r) for r in refs):
        if not os.path.isdir(RAW):
            pytest.skip(f"real data not found at {RAW}")
        from mt_pipeline.budget import prep_cmd

        subprocess.run(prep_cmd(res["config"]["budget"], references_only=True), cwd=th.ROOT, env=th.env(),
                       check=True, capture_output=True)
    rows = evidence.rescore(path)
    assert rows and all(r["bleu"] == pytest.approx(r["recorded_bleu"], abs=0.005) for r in rows)


def test_a_page_that_predates_evidence_is_replaced_only_as_a_whole(tmp_path, monkeypatch):
    """Issue 27: a full table carrying "Evidence: none committed." is not re-rendered while only some
    of the rows it shows numbers for have re-run (that would turn the others into "not run yet" and
    orphan the numbers the claims page quotes from them); once every such row has, it is (rows it
    shows as not run are not waited for); a page without the line is re-rendered at the first
    finished row, as before."""
    import mt_pipeline.reproduce as rp

    page = tmp_path / "t.md"
    spec = {"rows": [{"id": 1}, {"id": 2}], "out": str(page)}
    plan = {"_specs": {"t.yaml": spec}}
    done, rendered = {1}, []
    monkeypatch.setattr(run_table, "row_results", lambda s, r: [{}] if r["id"] in done else [])
    monkeypatch.setattr(run_table, "render", lambda s: rendered.append(s["out"]))
    monkeypatch.setattr(rp, "render_indexes", lambda outs: None)
    page.write_text(f"# T\n\n{evidence.NO_EVIDENCE}\n")
    assert evidence.predates_evidence(str(page)) and not evidence.predates_evidence(str(tmp_path / "none.md"))
    campaign.render_tables(plan)
    assert rendered == []
    done.add(2)
    campaign.render_tables(plan)
    assert rendered == [str(page)]
    rendered.clear()
    done.discard(2)
    page.write_text("# T\n")
    campaign.render_tables(plan)
    assert rendered == [str(page)]
    # a row the page shows as not run never held a number: it is not waited for (ReLUFormer T6's
    # L = 1024 / 2048 rows); a row it shows a number for is
    rendered.clear()
    spec["rows"].append({"id": 3})
    page.write_text(f"# T\n\n{evidence.NO_EVIDENCE}\n\n| ID | Model | paper X | ours test2016 | status |\n"
                    "|---|---|---|---|---|\n| 1 | A | 1.0 | 0.45 (0.45) | done |\n| 2 | B | 2.0 | 0.33 (0.33) | done |\n"
                    "| 3 | C | 3.0 | not run yet | pending |\n")
    assert rp.predated_rows_pending(str(page), {1: True, 2: False, 3: False}) == [2]
    campaign.render_tables(plan)
    assert rendered == []
    done.add(2)
    assert rp.predated_rows_pending(str(page), {1: True, 2: True, 3: False}) == []
    campaign.render_tables(plan)
    assert rendered == [str(page)]
    assert rp.predated_rows_pending(str(tmp_path / "none.md"), {1: False}) == []


def test_a_finished_run_gets_the_analyses_of_every_table_that_shows_it(tmp_path, monkeypatch):
    """Issue 27: E-ATT Table 4's energy column is an analysis of runs that other tables train
    (ReLA T1's softmax run, E-ATT T3's E-ATT run).  ``collect`` (after every run and at start-up)
    runs the analyses of each plan table showing a finished run, once, and exports their JSON with
    the evidence; a newer analysis re-exports it; a failing analysis is logged, not raised."""
    import pathlib

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    calls = tmp_path / "calls.txt"
    script = tmp_path / "fake_analysis.py"
    script.write_text(
        "import argparse, json\n"
        "p = argparse.ArgumentParser()\n"
        "for k in ('--checkpoint', '--data-bin', '--src', '--tgt', '--json'):\n"
        "    p.add_argument(k)\n"
        "a = p.parse_args()\n"
        f"open({str(calls)!r}, 'a').write(a.checkpoint + '\\n')\n"
        "import os\n"  # the run's scores were exported before its analysis started
        f"open({str(calls) + '.evidence'!r}, 'a').write(str(os.path.exists(os.environ['FAKE_EVIDENCE'])) + '\\n')\n"
        f"n = len(open({str(calls)!r}).read().splitlines())\n"  # a re-run analysis of a new model: new numbers
        "json.dump({'e': [41.0 + n]}, open(a.json, 'w'))\n")
    budget = "configs/multi30k/small_cpu.yaml"
    base = {"src": "en", "tgt": "de", "subsets": {"test": "test2016", "test1": "test2017"}, "paper_label": "paper",
            "budget": budget}
    t_spec = dict(base, title="t", out=str(tmp_path / "t.md"), runs=str(tmp_path / "runs" / "t"),
                  rows=[{"id": 1, "name": "base", "arch": "a"}, {"id": 2, "name": "other", "arch": "a"}])
    a_spec = dict(base, title="a", out=str(tmp_path / "a.md"), runs=str(tmp_path / "runs" / "a"),
                  rows=[{"id": 7, "name": "base", "arch": "a", "run": t_spec["runs"] + "/row1"}],
                  analyses=[{"name": "energy", "script": str(script), "key": "e"}])
    for name, spec in (("t", t_spec), ("a", a_spec)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump({"runs": [{"table": str(tmp_path / "t.yaml"), "rows": [1, 2]},
                                                  {"table": str(tmp_path / "a.yaml"), "rows": [7]}]}))
    plan = campaign.load_plan(str(plan_path))
    run1, run2 = plan["_runs"]
    assert len(plan["_runs"]) == 2 and str(tmp_path / "a.yaml") in run1.tables  # the shared run is one run
    ref = tmp_path / "ref.txt"
    ref.write_text("a man rides a bike\ntwo dogs play in the snow\n")
    for run in (run1, run2):
        d = pathlib.Path(run.dir)
        d.mkdir(parents=True)
        _fake_run(d, ["a man rides a bike", "two dogs play"], ref, 1, tmp_path)
        res = json.loads((d / "result.json").read_text())
        res["data"] = {"prep_dir": "data-bin/x"}
        (d / "result.json").write_text(json.dumps(res))
    ckpt, _ = run_table.experiment.decode_checkpoint(run1.row["_budget"], run1.dir)
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    pathlib.Path(ckpt).write_bytes(b"model")
    os.utime(ckpt, (time.time() - 60,) * 2)

    monkeypatch.setenv("FAKE_EVIDENCE", os.path.join(evidence.evidence_dir(run1.dir, run1.regime), "result.json"))
    written = campaign.collect(plan)
    assert len(written) == 2
    assert calls.read_text().splitlines() == [ckpt]  # run 2 is shown by no table with analyses
    # the scores' evidence existed when the analysis started (a window closing mid-analysis keeps it)
    assert (tmp_path / "calls.txt.evidence").read_text().splitlines() == ["True"]
    ev1 = pathlib.Path(evidence.evidence_dir(run1.dir, run1.regime))
    assert json.loads((ev1 / "analysis_energy.json").read_text()) == {"e": [42.0]}
    assert not (pathlib.Path(evidence.evidence_dir(run2.dir, run2.regime)) / "analysis_energy.json").exists()
    assert campaign.collect(plan) == [] and len(calls.read_text().splitlines()) == 1  # nothing new: nothing re-run
    # a newer checkpoint makes the analysis stale: it re-runs and the evidence is re-exported
    later = time.time() + 5
    os.utime(ckpt, (later, later))
    assert campaign.collect(plan) == [str(ev1)] and len(calls.read_text().splitlines()) == 2
    assert json.loads((ev1 / "analysis_energy.json").read_text()) == {"e": [43.0]}
    # a fresh checkout (the shared run's directory gone): the table reads the column from the evidence
    import shutil

    spec_a = run_table.load_table(str(tmp_path / "a.yaml"))
    shutil.copytree(run1.dir, tmp_path / "run1_kept")
    shutil.rmtree(run1.dir)
    (row7,) = spec_a["rows"]
    (res7,) = run_table.row_results(spec_a, row7)
    assert res7["_dir"] == str(ev1) and run_table._analysis_cells(spec_a, row7, res7) == ["43.000"]
    shutil.copytree(tmp_path / "run1_kept", run1.dir)
    # an analysis that fails leaves no file and does not raise
    os.unlink(pathlib.Path(run1.dir) / "analysis_energy.json")
    script.write_text("raise SystemExit(3)\n")
    assert campaign.analyse(plan, run1) == []
    assert not (pathlib.Path(run1.dir) / "analysis_energy.json").exists()


def test_an_analysed_checkpoint_is_traced_to_its_run_and_committed_evidence(tmp_path, monkeypatch):
    """Issue 27: an analysis page (E-ATT Figure 2, the attention analysis) names the training run of
    each model it measured and that run's committed evidence -- only when the evidence records this
    very checkpoint (its SHA-256 is the run's decoded checkpoint); otherwise it says there is none."""
    from mt_pipeline import provenance

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    run = tmp_path / "runs" / "t" / "row1"
    (run / "checkpoints").mkdir(parents=True)
    ckpt, last = run / "average_last3.pt", run / "checkpoints" / "checkpoint_last.pt"
    ckpt.write_bytes(b"averaged")
    last.write_bytes(b"last")
    sha = provenance.file_sha256(str(ckpt))
    res = {"regime": "smoke", "seed": 2, "updates": 400, "git_commit": "abc", "decoded_checkpoint_sha256": sha}
    (run / "result.json").write_text(json.dumps(res))

    m = provenance.trained_model(str(ckpt))
    assert (m["run_dir"], m["regime"], m["seed"], m["updates"], m["decoded"], m["evidence"]) == (
        str(run), "smoke", 2, 400, True, None)  # outside the repository: paths stay absolute
    head, section = provenance.models_markdown({"softmax": m})
    assert head.startswith("**Regime: smoke** -- ") and provenance.NO_EVIDENCE in head and "Seeds: 2" in head
    assert "mt-campaign run --plan configs/campaign/" in head and "softmax" in head
    ev = provenance.evidence_dir(str(run), "smoke")
    os.makedirs(ev)
    with open(os.path.join(ev, "result.json"), "w") as f:
        json.dump(dict(res, decoded_checkpoint_sha256="0" * 64), f)  # evidence of another checkpoint
    assert provenance.trained_model(str(ckpt))["evidence"] is None
    with open(os.path.join(ev, "result.json"), "w") as f:
        json.dump(res, f)
    m = provenance.trained_model(str(ckpt))
    assert m["evidence"] == ev
    head, section = provenance.models_markdown({"softmax": m})
    assert provenance.NO_EVIDENCE not in head
    assert f"### Model softmax: `{ckpt}`" in section and f"- checkpoint sha256: `{sha}`" in section
    assert f"- committed evidence (result.json, hypotheses, training log): `{ev}`" in section
    # a checkpoint in checkpoints/ belongs to the run above it, but is not the one it was scored with
    other = provenance.trained_model(str(last))
    assert other["run_dir"] == str(run) and not other["decoded"] and other["evidence"] is None
    head, section = provenance.models_markdown({"softmax": m, "last": other})
    assert "**not** the checkpoint the run was scored with" in section and "last have no committed" in head
    # the weakest regime leads: a converged model beside a smoke one is a smoke page
    assert provenance.models_markdown({"a": dict(m, regime="converged"), "b": m})[0].startswith("**Regime: smoke**")
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        provenance.trained_model(str(tmp_path / "missing.pt"))


def test_the_minutes_estimate_is_per_model_and_counts_everything_but_training(tmp_path, monkeypatch):
    """``--minutes`` estimates from finished runs of the same model where there are any (ReLUFormer
    runs train slower than softmax ones on the same budget and device), and the time outside
    training is the launcher's wall time less training (process start, decoding, scoring), not only
    the runner-timed averaging + evaluation."""
    plan = campaign.load_plan(campaign.DEFAULT_PLAN)
    by_key = {r.key: r for r in plan["_runs"]}
    softmax_run, reluformer_run = by_key["reluformer_lambda_study row1 seed1"], by_key["reluformer_lambda_study row3 seed1"]
    budget = os.path.realpath(softmax_run.budget)

    def result(d, arch, fns, train_s, started, finished):
        os.makedirs(d)
        res = {"status": "done", "updates": 3000, "name": d.name, "time": finished, "git_commit": "x", "arch": arch,
               "attention_fns": fns, "config": {"budget_file": budget},
               "hardware": {"accelerator": "GPU X", "cpu": "c", "cores": 16},
               "wall_s": {"train": train_s + 10, "train_fairseq_cumulative": train_s, "average": 8, "evaluate": 100},
               "campaign": {"jobs": 12, "started": started, "finished": finished}}
        (d / "result.json").write_text(json.dumps(res))
        return str(d)

    monkeypatch.setattr(evidence, "committed_results", lambda root=None: [])
    dirs = [result(tmp_path / "soft", "rela_transformer_small", {"encoder": "softmax", "decoder": "softmax",
                                                                  "cross": "softmax"}, 300, "2026-01-01 10:00:00",
                   "2026-01-01 10:08:10"),
            result(tmp_path / "relu", "reluformer_small", "arch default", 600, "2026-01-01 10:00:00",
                   "2026-01-01 10:14:10")]
    recs = campaign.throughput_records(dirs)
    assert [r["model"] for r in recs] == [("rela_transformer_small", ("softmax",) * 3), ("reluformer_small", None)]
    # wall 490 s less 310 s of training: 180 s outside it (the runner timed 108 of them)
    assert recs[0]["overhead_s"] == 180 and recs[1]["overhead_s"] == 850 - 610
    est = lambda run: campaign.estimate_minutes(run, recs, "GPU X", 12, run.budget)  # noqa: E731
    assert est(softmax_run) == pytest.approx((300 + 180) / 60)
    assert est(reluformer_run) == pytest.approx((600 + 240) / 60)
    # a model with no finished run of its own: the same architecture's runs, else all of them
    other_fns = by_key["rela_table1 row2 seed1"]  # rela_transformer_small with sparsemax
    assert est(other_fns) == pytest.approx((300 + 180) / 60)
    eatt = by_key["eatt_table4 row2 seed2"]
    assert est(eatt) == pytest.approx(((300 + 600) / 2 + (180 + 240) / 2) / 60)
    # a budget with no run of its own that trains the same way for twice the updates (converged_6k):
    # the converged runs' seconds per update, times 6,000; a budget that trains otherwise: no estimate
    long = {r.key: r for r in campaign.load_plan("configs/campaign/converged_6k.yaml")["_runs"]}
    assert est(long["reluformer_lambda_study row1 seed1"]) == pytest.approx((600 + 180) / 60)
    assert est(long["reluformer_lambda_study row4 seed1"]) == pytest.approx((1200 + 240) / 60)
    smoke = {r.key: r for r in campaign.load_plan("configs/campaign/smoke.yaml")["_runs"]}
    assert est(smoke["reluformer_lambda_study row1 seed1"]) is None  # the diagnostic budget: another schedule
    # without the launcher's stamps the runner-timed stages are all there is
    res = json.loads((tmp_path / "soft" / "result.json").read_text())
    res["campaign"] = {"jobs": 12}
    (tmp_path / "soft" / "result.json").write_text(json.dumps(res))
    assert campaign.throughput_records(dirs[:1])[0]["overhead_s"] == 108


@needs_data
def test_a_plan_names_post_training_steps_and_is_refused_when_they_cannot_run(tmp_path):
    """``after:``: the smoke plan's Flexible steps need the plan's Table 1 runs (both directions for the
    tau sweep; de-en rows 1, 3, 4 for Table 3's benchmark); an unknown step or one whose table the
    plan does not train is refused with the valid choices."""
    smoke = campaign.load_plan("configs/campaign/smoke.yaml")
    steps = {s.key: s for s in smoke["_after"]}
    assert list(steps) == ["flexible table1", "flexible table3"]
    assert sorted(r.key for r in steps["flexible table1"].runs) == sorted(
        f"flexible_table1_{d} row{i} seed1" for d in ("de_en", "en_de") for i in (1, 2, 3, 4))
    assert sorted(r.key for r in steps["flexible table3"].runs) == [
        f"flexible_table1_de_en row{i} seed1" for i in (1, 3, 4)]
    assert steps["flexible table1"].pages == ["results/flexible/table1_multi30k.md"]
    assert steps["flexible table3"].pages == ["results/flexible/table3_decode_time_multi30k.md"]

    good = {"runs": [{"table": "configs/flexible/table1_multi30k_de_en.yaml", "rows": [1, 2, 3, 4]}]}

    def refused(after, *words):
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump(dict(good, after=after)))
        with pytest.raises(SystemExit) as err:
            campaign.load_plan(str(path))
        for w in words:
            assert w in str(err.value), str(err.value)

    refused({"paper": "flexible"}, "'after' must be a list")
    refused([{"paper": "flexible", "tabel": "table1"}], "unknown keys")
    refused([{"paper": "rela", "table": "table1"}], "'rela table1' has no post-training steps", "'flexible table1'",
            "'rela table5'")
    refused([{"paper": "flexible", "table": "table1"}], "does not run ['configs/flexible/table1_multi30k_en_de.yaml']")
    path = tmp_path / "p.yaml"
    refused([{"paper": "flexible", "table": "table3"}], "does not run ['configs/flexible/table3_multi30k_de_en.yaml']")
    t3 = {"runs": [{"table": "configs/flexible/table3_multi30k_de_en.yaml", "rows": [1, 3, 4]}],
          "after": [{"paper": "flexible", "table": "table3"}]}
    path.write_text(yaml.safe_dump(t3))
    assert [r.key for r in campaign.load_plan(str(path))["_after"][0].runs] == [
        f"flexible_table1_de_en row{i} seed1" for i in (1, 3, 4)]


@needs_data
def test_a_converged_plan_runs_the_converged_post_training_commands_on_its_runs(tmp_path):
    """A plan with a converged ``budget:`` takes the table's converged commands: ReLA Table 5's step
    reads runs/converged/rela_table1/row1, 2, 3, 7 (seed 1: the run directories its
    command names, none of T1's other rows or seeds), and writes the converged page; a small-scale plan
    takes the small commands on the small runs; a step whose commands read run directories the plan
    does not train (a budget tagging its runs otherwise) is refused, naming the directory."""
    path = tmp_path / "conv.yaml"
    path.write_text(yaml.safe_dump({"budget": "configs/multi30k/converged.yaml",
                                    "runs": [{"table": "configs/rela/table1.yaml", "rows": [1, 7], "seeds": [1, 2, 3]},
                                             {"table": "configs/rela/table5_aer.yaml", "rows": [1, 2, 3, 4]}],
                                    "after": [{"paper": "rela", "table": "table5"}]}))
    step, = campaign.load_plan(str(path))["_after"]
    assert step.key == "rela table5" and step.pages == ["results/rela/table5_aer_multi30k_converged.md"]
    assert [os.path.relpath(r.dir, campaign.ROOT) for r in step.runs] == [
        f"runs/converged/rela_table1/row{i}" for i in (1, 7, 2, 3)]  # plan order
    assert all("runs/converged/rela_table1/row" in a for a in step.commands[0] if a.startswith(("softmax=", "rela_g=")))
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"runs": [{"table": "configs/rela/table1.yaml", "rows": list(range(1, 14))},
                                             {"table": "configs/rela/table5_aer.yaml", "rows": [1, 2, 3, 4]}],
                                    "after": [{"paper": "rela", "table": "table5"}]}))
    small, = campaign.load_plan(str(path))["_after"]
    assert small.pages == ["results/rela/table5_aer_multi30k.md"]
    assert [r.key for r in small.runs] == [f"rela_table1 row{i} seed1" for i in (1, 2, 3, 7)]
    six = yaml.safe_load(open(os.path.join(campaign.ROOT, "configs/campaign/converged_6k.yaml")))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"budget": six["budget"], "runs": [{"table": "configs/rela/table5_aer.yaml",
                                                                        "rows": [1, 2, 3, 4]}],
                                    "after": [{"paper": "rela", "table": "table5"}]}))
    with pytest.raises(SystemExit, match=r"steps read runs/converged/rela_table1/row1, which is none of the run directories"):
        campaign.load_plan(str(path))
    path.write_text(yaml.safe_dump({"budget": "configs/multi30k/converged.yaml",
                                    "runs": [{"table": "configs/eatt/table4_multi30k.yaml", "rows": [1]}],
                                    "after": [{"paper": "eatt", "table": "table4"}]}))  # its energy step: small only
    with pytest.raises(SystemExit, match=r"'eatt table4' has no post-training steps at converged scale; "
                                         r"valid: \['rela table5'\]"):
        campaign.load_plan(str(path))


def test_post_training_steps_retrain_evidence_only_runs_then_run_once_until_the_page_has_evidence(
        tmp_path, monkeypatch):
    """A step not done makes its runs that exist only as committed evidence train again; once all have
    finished here it runs (niced, logged), and its marker keeps it from running again on the same
    runs while its page still lacks evidence; a run finishing again makes it ready again; a page
    with evidence is done, and nothing retrains for it."""
    import mt_pipeline.reproduce as rp

    monkeypatch.setattr(campaign, "AFTER_LOGS", str(tmp_path / "after"))
    monkeypatch.setattr(rp, "write_index", lambda *a: None)  # never into results/
    page = tmp_path / "page.md"
    counter = tmp_path / "count"
    # the step's command writes the page: without evidence while FLAG exists, with it afterwards
    flag = tmp_path / "flag"
    script = (f"import os; c = {str(counter)!r}; n = int(open(c).read()) + 1 if os.path.exists(c) else 1; "
              f"open(c, 'w').write(str(n)); "
              f"open({str(page)!r}, 'w').write('# T\\n' + ({evidence.NO_EVIDENCE!r} if os.path.exists({str(flag)!r}) "
              f"else 'evidence: results/runs/x\\n'))")
    runs = [campaign.Run(key=f"t row{i} seed1", table="t.yaml", spec={}, row={"id": i, "_budget": {"train": {}}}, seed=1,
                         dir=str(tmp_path / "runs" / f"row{i}"), tables=["t.yaml"]) for i in (1, 2)]
    step = campaign.AfterStep(key="flexible table1", paper="flexible", table="table1",
                              commands=[[sys.executable, "-c", script]], pages=[str(page)], runs=runs)
    plan = {"_runs": runs, "_after": [step]}
    committed = {runs[0].dir}  # row 1's result is only in committed evidence; row 2 has never run
    monkeypatch.setattr(campaign, "run_state", lambda r: {"state": "done" if r.dir in committed else "pending",
                                                          "reason": None, "updates": 0, "where": None})

    finishes = []

    def finish(run):
        os.makedirs(run.dir, exist_ok=True)
        res = os.path.join(run.dir, "result.json")
        with open(res, "w") as f:
            json.dump({"status": "done"}, f)
        finishes.append(run.key)
        t = 1.7e9 + 10 * len(finishes)
        os.utime(res, (t, t))  # a later finish is seen as later even within the same second

    assert campaign.after_state(step) == {"state": "waiting", "reason": "0 of 2 runs it needs finished here"}
    assert [r.key for r in campaign._retrain_for_after(plan)] == ["t row1 seed1"]
    assert [r.key for r in campaign._candidates(plan, False)] == ["t row1 seed1", "t row2 seed1"]
    assert campaign.run_after_steps(plan) == []  # waiting: nothing runs
    monkeypatch.setattr(campaign, "throughput_records", lambda dirs: [])
    monkeypatch.setattr(campaign, "estimate_minutes", lambda *a: None)
    monkeypatch.setattr(run_table, "row_budget", lambda spec, row: "budget.yaml")
    assert [r["reason"] for r in campaign.status(plan)] == [
        "trains again here: a post-training step (after:) needs its checkpoints", None]
    finish(runs[0])
    assert campaign._retrain_for_after(plan) == []  # trained here now
    finish(runs[1])
    assert campaign.after_state(step)["state"] == "ready"
    flag.write_text("")
    assert campaign.run_after_steps(plan, nice=1) == ["flexible table1"]
    assert counter.read_text() == "1" and evidence.predates_evidence(str(page))
    st = campaign.after_state(step)
    assert st["state"] == "ran" and "exit status 0" in st["reason"]
    assert campaign.run_after_steps(plan) == []  # the same runs: not again
    finish(runs[1])  # row 2 finished again (re-trained): the step is ready again
    flag.unlink()
    assert campaign.after_state(step)["state"] == "ready"
    assert campaign.run_after_steps(plan) == ["flexible table1"]
    assert counter.read_text() == "2" and campaign.after_state(step)["state"] == "done"
    shutil.rmtree(runs[0].dir)  # a fresh machine: the page has evidence, nothing retrains
    assert campaign._retrain_for_after(plan) == [] and campaign.run_after_steps(plan) == []
    log = (tmp_path / "after" / "flexible_table1.log").read_text()
    assert log.count("[campaign]") == 2
    # a failing command is logged with its exit status, stops the step and marks the runs it ran on
    page.write_text(f"# T\n{evidence.NO_EVIDENCE}\n")
    assert [r.key for r in campaign._retrain_for_after(plan)] == ["t row1 seed1"]
    finish(runs[0])
    step.commands = [[sys.executable, "-c", "raise SystemExit(3)"], [sys.executable, "-c", script]]
    assert campaign.run_after_steps(plan) == ["flexible table1"]
    assert counter.read_text() == "2"  # the second command did not run after the first failed
    assert json.loads((tmp_path / "after" / "flexible_table1.json").read_text())["returncode"] == 3
    st = campaign.after_state(step)
    assert st["state"] == "ran" and "exit status 3" in st["reason"]
    # a step reading a file an earlier step writes (Table 3's --tau-from <Table 1's sweep.json>) waits
    # for it, then runs; a file it reads changing makes it ready again, like a run finishing again
    sweep = tmp_path / "runs" / "row1" / "sweep" / "sweep.json"
    monkeypatch.setattr(campaign, "ROOT", str(tmp_path))
    step.inputs = ["runs/row1/sweep/sweep.json"]
    step.commands = [[sys.executable, "-c", script]]
    assert campaign.after_state(step) == {"state": "waiting", "reason": "needs runs/row1/sweep/sweep.json, which is "
                                                                         "not there yet (an earlier step or a run writes it)"}
    assert campaign.run_after_steps(plan) == []
    sweep.parent.mkdir(parents=True)
    sweep.write_text("{}")
    assert campaign.after_state(step)["state"] == "ready"  # the failed run's marker does not hold it back
    flag.write_text("")
    assert campaign.run_after_steps(plan) == ["flexible table1"] and counter.read_text() == "3"
    assert campaign.after_state(step)["state"] == "ran"
    os.utime(sweep, (1.8e9, 1.8e9))  # the sweep re-written
    assert campaign.after_state(step)["state"] == "ready"


def test_post_training_commands_name_the_files_they_read():
    """reproduce.step_inputs: the files under runs/ a post-training command reads (checkpoints, a
    sweep.json), not run directories nor what it writes; the smoke plan's Table 3 step reads Table
    1's de-en sweep, so it waits for Table 1's step."""
    from mt_pipeline.reproduce import step_inputs

    assert step_inputs(["py", "-m", "x", "--runs", "runs/a", "runs/b", "--tau-from", "runs/a/row3/sweep/sweep.json",
                        "--flexible", "runs/a/row4/average_last1.pt", "--out", "results/x.md",
                        "--run", "runs/converged/t/row5-lambda0.01"]) == [
        "runs/a/row3/sweep/sweep.json", "runs/a/row4/average_last1.pt"]  # a dotted run directory is no file
    steps = {s.key: s for s in campaign.load_plan("configs/campaign/smoke.yaml")["_after"]}
    assert "runs/flexible_table1_de_en/row3/sweep/sweep.json" in steps["flexible table3"].inputs
    assert steps["flexible table1"].inputs == []
    # and Table 1's step declares that it writes it (reproduce.after_writes), so on a fresh machine
    # its committed page does not stand in for the missing file (test below)
    assert "runs/flexible_table1_de_en/row3/sweep/sweep.json" in steps["flexible table1"].writes


def test_a_done_step_runs_again_when_a_step_not_done_reads_a_file_it_writes_that_is_missing(tmp_path, monkeypatch):
    """A fresh machine: Table 1's page is committed with evidence, its git-ignored sweep.json is gone
    and Table 3's page still lacks evidence.  Table 1's step is then not done: its runs train again
    (not only Table 3's), it becomes ready once they have finished, and done again once the file is
    there; without a step that reads the file (Table 3's page done) the committed page suffices."""
    monkeypatch.setattr(campaign, "ROOT", str(tmp_path))
    monkeypatch.setattr(campaign, "AFTER_LOGS", str(tmp_path / "after"))
    runs = [campaign.Run(key=f"t row{i} seed1", table="t.yaml", spec={}, row={"id": i, "_budget": {"train": {}}},
                         seed=1, dir=str(tmp_path / "runs" / f"row{i}"), tables=["t.yaml"]) for i in (1, 3)]
    p1, p3 = tmp_path / "t1.md", tmp_path / "t3.md"
    p1.write_text("# T1\nevidence: results/runs/x\n")
    p3.write_text(f"# T3\n{evidence.NO_EVIDENCE}\n")
    sweep = "runs/row3/sweep/sweep.json"
    t1 = campaign.AfterStep(key="flexible table1", paper="flexible", table="table1", commands=[], pages=[str(p1)],
                            runs=runs, writes=[sweep])
    t3 = campaign.AfterStep(key="flexible table3", paper="flexible", table="table3", commands=[], pages=[str(p3)],
                            runs=runs[1:], inputs=[sweep])
    plan = {"_runs": runs, "_after": [t1, t3]}
    monkeypatch.setattr(campaign, "run_state", lambda r: {"state": "done", "reason": None, "updates": 0, "where": None})

    assert campaign.after_state(t1) == {"state": "done", "reason": None}  # without the plan: its pages only
    st = campaign.after_state(t1, plan)
    assert st["state"] == "waiting" and f"another step reads {sweep}" in st["reason"], st
    assert [r.key for r in campaign._retrain_for_after(plan)] == ["t row1 seed1", "t row3 seed1"]
    for r in runs:  # re-trained here
        os.makedirs(r.dir)
        with open(os.path.join(r.dir, "result.json"), "w") as f:
            json.dump({"status": "done"}, f)
    st = campaign.after_state(t1, plan)
    assert st["state"] == "ready" and st["reason"].startswith("its pages are done, but another step reads"), st
    st = campaign.after_state(t3, plan)
    assert st["state"] == "waiting" and st["reason"].startswith(f"needs {sweep}"), st  # for Table 1's step
    # a command that does not write the file runs once on these runs, not again and again
    import mt_pipeline.reproduce as rp

    monkeypatch.setattr(rp, "write_index", lambda *a: None)  # never into results/
    t1.commands = [[sys.executable, "-c", "pass"]]
    assert campaign.run_after_steps(plan) == ["flexible table1"]  # Table 3 still waits
    st = campaign.after_state(t1, plan)
    assert st["state"] == "ran" and f"{sweep} is still missing" in st["reason"], st
    assert campaign.run_after_steps(plan) == [] and campaign._retrain_for_after(plan) == []
    os.makedirs(tmp_path / "runs" / "row3" / "sweep")
    (tmp_path / sweep).write_text("{}")
    assert campaign.after_state(t1, plan) == {"state": "done", "reason": None}
    assert campaign.after_state(t3, plan)["state"] == "ready"
    (tmp_path / sweep).unlink()
    p3.write_text("# T3\nevidence: results/runs/y\n")  # nothing not done reads it: the page suffices
    assert campaign.after_state(t1, plan) == {"state": "done", "reason": None}
    shutil.rmtree(tmp_path / "runs")  # another fresh machine: both pages have evidence, nothing retrains
    assert campaign._retrain_for_after(plan) == []


def test_a_slurm_job_gone_from_the_queue_without_a_result_is_resumable(tmp_path, monkeypatch):
    """A review's probe: with --no-wait (or the waiting mt-campaign killed) nothing records that a
    SLURM job ended, so a job that hit its time limit stayed "submitted" and was never queued again."""
    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    run = campaign.Run(key="t row1 seed1", table="t.yaml", spec={}, row={"id": 1, "_budget": {"train": {}}}, seed=1,
                       dir=str(tmp_path / "runs" / "row1"), tables=["t.yaml"])
    os.makedirs(os.path.join(run.dir, "checkpoints"))
    with open(os.path.join(run.dir, "campaign.json"), "w") as f:
        json.dump({"launcher": "slurm", "cluster": "slurm", "job_id": "4242"}, f)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for script, state, reason in (
            ("echo RUNNING", "submitted", "job 4242"),  # still in the queue
            ("exit 0", "pending", "slurm job 4242 ended without a result"),  # left it: nothing printed
            ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", "pending",
             "slurm job 4242 ended without a result"),  # forgotten by SLURM
            ("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1", "submitted",
             "job 4242 (squeue not available: not checked)")):  # cannot tell: keep waiting
        squeue.write_text(f"#!/bin/sh\n{script}\n")
        squeue.chmod(0o755)
        st = campaign.run_state(run)
        assert (st["state"], st["reason"]) == (state, reason), (script, st)
    squeue.write_text("#!/bin/sh\nexit 0\n")
    with open(os.path.join(run.dir, "checkpoints", "checkpoint_last.pt"), "w") as f:
        f.write("x")  # trained a while before its time limit: resumes from its checkpoint
    st = campaign.run_state(run)
    assert (st["state"], st["reason"]) == ("partial", "slurm job 4242 ended without a result")
    with open(os.path.join(run.dir, "campaign.json"), "w") as f:
        json.dump({"launcher": "slurm", "cluster": "local", "job_id": "77"}, f)  # submitit's local executor
    assert campaign.run_state(run)["state"] == "submitted"


def test_a_killed_retry_of_a_failed_run_shows_partial_not_the_old_failure(tmp_path, monkeypatch):
    """A review's probe: ``--retry-failed`` on a failure held only in committed evidence (a fresh
    checkout) left no trace in the run directory, so a retry killed mid-training showed the old
    failure again (and was not resumed without ``--retry-failed``)."""
    from mt_pipeline.budget import load_budget

    monkeypatch.setenv("MT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    row = {"id": 2, "_budget": load_budget(os.path.join(th.ROOT, "configs", "multi30k", "small_cpu.yaml"))}
    run = campaign.Run(key="t row2 seed1", table="t.yaml", spec={"tgt": "de"}, row=row, seed=1,
                       dir=str(tmp_path / "runs" / "t" / "smoke" / "row2"), tables=["t.yaml"])
    ev = evidence.evidence_dir(run.dir, run.regime)
    os.makedirs(ev)
    failed = {"status": "failed", "error_tail": ["RuntimeError: boom"], "updates": 40}
    with open(os.path.join(ev, "result.json"), "w") as f:
        json.dump(failed, f)
    st = campaign.run_state(run)
    assert st["state"] == "failed" and st["reason"].endswith("RuntimeError: boom")
    # the campaign's --retry-failed step: the committed failure is recorded in the run directory
    moved = run_table.retire_failed(run.dir, st["result"])
    assert moved and json.load(open(moved)) == failed
    assert json.load(open(os.path.join(ev, "result.json"))) == failed  # evidence untouched
    assert campaign.run_state(run)["state"] == "pending"  # the retry, not yet started
    os.makedirs(os.path.join(run.dir, "checkpoints"))
    with open(os.path.join(run.dir, "checkpoints", "checkpoint_last.pt"), "w") as f:
        f.write("x")  # the retry trained a while, then was killed
    assert campaign.run_state(run)["state"] == "partial"
    # the retry failing again is a failure; succeeding is done (its own result.json comes first)
    for status, state in (("failed", "failed"), ("done", "done")):
        with open(os.path.join(run.dir, "result.json"), "w") as f:
            json.dump({**failed, "status": status, "valid_loss": [[40, 3.0]]}, f)
        assert campaign.run_state(run)["state"] == state
    # a successful committed run is not hidden by an old retired failure
    os.remove(os.path.join(run.dir, "result.json"))
    with open(os.path.join(ev, "result.json"), "w") as f:
        json.dump({**failed, "status": "done", "valid_loss": [[40, 3.0]]}, f)
    assert campaign.run_state(run)["state"] == "done"
    # nothing to retire: a done record, or no record at all
    assert run_table.retire_failed(str(tmp_path / "elsewhere"), None) is None
    assert run_table.retire_failed(str(tmp_path / "elsewhere"), {"status": "done"}) is None
    assert not (tmp_path / "elsewhere").exists()


def test_other_budget_ignores_the_seed_and_a_paper_budgets_gpu_split():
    """A paper-scale run records its budget without the GPU split of its batch (experiment.run_config: it may
    resume on another GPU count), so that split is no difference; the seed never is; anything else is."""
    row = {"_budget": {"regime": "paper", "batch": {"tokens": 25000},
                       "train": {"lr": 7e-4, "max-tokens": 4096, "update-freq": 6, "seed": 1}}}
    recorded = {"regime": "paper", "batch": {"tokens": 25000}, "train": {"lr": 7e-4, "seed": 3}}
    assert campaign.other_budget({"config": {"budget": recorded}}, row) is None
    recorded["train"]["lr"] = 1e-3
    assert campaign.other_budget({"config": {"budget": recorded}}, row) == \
        "trained under another budget (train.lr differ)"
    del row["_budget"]["batch"], recorded["batch"]  # without `batch`, the split is part of the budget
    recorded["train"]["lr"] = 7e-4
    assert campaign.other_budget({"config": {"budget": recorded}}, row) == \
        "trained under another budget (train.max-tokens, train.update-freq differ)"
    assert campaign.other_budget({"config": {}}, row) is None  # an older record without its budget: not judged
