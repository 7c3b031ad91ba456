"""``--lr-scheduler warmup_hold_inverse_sqrt`` (fairseq_plugins/optim): E-ATT's schedule
lr(t) = 0.001 * min(t / 8000, 1, (20000 / t) ** 0.5) (App. B), built through fairseq's own parser
and registry, checked update by update against the formula written out here, against fairseq's
stock inverse_sqrt (which it must differ from after the warmup), on resume, and in a real
fairseq-train run whose logged rates follow the formula."""

import math
import re
import sys

import pytest

import fairseq_plugins  # noqa: F401  (registers the scheduler)
from train_helpers import make_databin, run, train_args


def paper_lr(t):
    """E-ATT App. B, verbatim: the rate of update t (1-based)."""
    return 0.001 * min(t / 8000, 1, (20000 / t) ** 0.5)


def build(*flags):
    """(scheduler, optimizer) from a fairseq-train command line, as fairseq's Trainer builds them."""
    import torch
    from fairseq import optim, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=["data-bin/none", "--arch", "transformer",
                                                           "--optimizer", "adam", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    opt = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(2))])
    return build_lr_scheduler(cfg.lr_scheduler, opt), opt


EATT = ["--lr", "0.001", "--lr-scheduler", "warmup_hold_inverse_sqrt", "--warmup-updates", "8000",
        "--decay-start-updates", "20000"]


def test_every_update_uses_the_paper_rate():
    sched, opt = build(*EATT)
    sched.step_update(0)  # as fairseq's Trainer does once the optimizer exists
    used = []
    for t in range(1, 60001):
        used.append(opt.get_lr())  # the rate update t runs with
        sched.step_update(t)  # Trainer.set_num_updates(t) after update t
    worst = max(abs(u - paper_lr(t)) / paper_lr(t) for t, u in enumerate(used, 1))
    assert worst < 1e-12
    assert used[0] == pytest.approx(0.001 / 8000)
    assert used[7999] == used[12000] == used[19999] == pytest.approx(0.001)  # the hold
    assert used[79999 - 20000] < used[19999]
    assert used[59999] == pytest.approx(0.001 * math.sqrt(20000 / 60000))


def test_differs_from_fairseq_inverse_sqrt_after_the_warmup():
    ours, o1 = build(*EATT)
    stock, o2 = build("--lr", "0.001", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "8000")
    # the rate each sets for update t: ours lr * t / W after t - 1 updates; inverse_sqrt sets
    # lr * n / W after n updates (one update later) -- compare the same values
    for t in (2000, 7999):  # warmup: the same linear ramp
        ours.step_update(t - 1)
        stock.step_update(t)
        assert o1.get_lr() == pytest.approx(o2.get_lr(), rel=1e-9)
    for t in (12000, 19999):  # the hold: inverse_sqrt already decays
        ours.step_update(t - 1)
        stock.step_update(t)
        assert o1.get_lr() == pytest.approx(0.001) and o2.get_lr() < 0.001 * 0.9
    for t in (20000, 50000, 150000):  # decay: ours is sqrt(D / W) higher
        ours.step_update(t - 1)
        stock.step_update(t)
        assert o1.get_lr() / o2.get_lr() == pytest.approx(math.sqrt(20000 / 8000), rel=1e-9)


def test_resume_continues_the_sequence():
    sched, opt = build(*EATT)
    sched.step_update(12344)  # Trainer.load_checkpoint at update 12344
    assert opt.get_lr() == pytest.approx(paper_lr(12345), rel=1e-12)
    sched.step_update(31000)
    assert opt.get_lr() == pytest.approx(paper_lr(31001), rel=1e-12)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="1 <= --warmup-updates <= --decay-start-updates"):
        build("--lr", "0.001", "--lr-scheduler", "warmup_hold_inverse_sqrt", "--warmup-updates", "8000",
              "--decay-start-updates", "4000")
    with pytest.raises(ValueError, match="takes one --lr"):
        build("--lr", "0.001,0.002", "--lr-scheduler", "warmup_hold_inverse_sqrt")


def test_fairseq_train_logs_the_scheduled_rates(tmp_path):
    """A real fairseq-train run (W = 4, D = 10, 30 updates): after update n fairseq logs the rate
    it set for update n + 1, lr * min((n+1)/W, 1, sqrt(D/(n+1)))."""
    data = make_databin(str(tmp_path / "data"))
    out = run([sys.executable, "-m", "fairseq_cli.train",
               *train_args(data, str(tmp_path / "ck"), "--lr", "0.002", "--lr-scheduler", "warmup_hold_inverse_sqrt",
                           "--warmup-updates", "4", "--decay-start-updates", "10", "--max-update", "30",
                           "--arch", "eatt_transformer_small", "--no-save")])
    log = out.stdout + out.stderr
    assert "fairseq_plugins" in log and "warmup_hold_inverse_sqrt" in log
    seen = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"\| train_inner \|.*?num_updates=(\d+), lr=([\d.e-]+)", log)}
    assert sorted(seen) == list(range(1, 31))
    for n, lr in seen.items():
        t = n + 1
        assert lr == pytest.approx(0.002 * min(t / 4, 1, math.sqrt(10 / t)), rel=1e-3), n
