"""Data-parallel training on fairseq's distributed engine, launched by torchrun (CPU, gloo).

``scripts/train_distributed.py`` maps torchrun's RANK/WORLD_SIZE/LOCAL_RANK to fairseq's
``--distributed-*`` flags (see its docstring for why plain ``torchrun fairseq-train`` starts
independent jobs on CPU).  The end-to-end test trains a 2+2-layer ReLUFormer model with the
regularised criterion (auxiliary losses) and ReLA-g / 1.5-entmax in the other attention types
for 4 updates on 2 ranks, and compares it with one process and ``--update-freq 2``: fairseq
gives rank r the batches r, r+2, ... and groups batches (0, 1), (2, 3), ... for update-freq 2,
so both see the same batches per update.
"""

import os
import sys
import textwrap

import pytest
import torch

import train_helpers as th

from mt_pipeline.launch import distributed_flags

TORCHRUN = os.path.join(th.BIN, "torchrun")

# Rank r computes the gradient g_r of its batch; gloo sums g_0 + g_1 and legacy_ddp divides by
# the world size, the trainer then multiplies by world_size / sample_size.  One process with
# --update-freq 2 accumulates g_0 + g_1 in autograd and multiplies by 1 / sample_size.  With 2
# terms the sums are equal (float addition is commutative) and the factors 2 are exact, so the
# runs may agree bit for bit; the tolerance admits reordered float32 sums (gloo's ring order,
# autograd's accumulation order across shared parameters), ~1e-7 relative per update, times 4
# Adam updates of lr 3e-3.
ATOL = 1e-5


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return th.make_databin(str(tmp_path_factory.mktemp("toy")))


EXTRA = ("--criterion", "label_smoothed_cross_entropy_with_reg", "--label-smoothing", "0.1",
         "--reg-weight", "1.0", "--decoder-attention-fn", "rela_g", "--cross-attention-fn", "entmax15",
         "--max-update", "4", "--save-interval-updates", "4", "--disable-validation")

# Runs train_distributed.main() after wrapping fairseq's save_checkpoint (in this test process
# only) so that every rank, not only rank 0, also writes its replica's parameters.
DRIVER = textwrap.dedent("""
    import os, sys, torch
    from mt_pipeline import launch as train_distributed
    from fairseq import checkpoint_utils
    _save = checkpoint_utils.save_checkpoint
    def save(cfg, trainer, epoch_itr, val_loss):
        state = {{k: v.detach().clone() for k, v in trainer.model.state_dict().items()}}
        torch.save(state, os.path.join(cfg.save_dir, "replica%d.pt" % trainer.data_parallel_rank))
        return _save(cfg, trainer, epoch_itr, val_loss)
    checkpoint_utils.save_checkpoint = save
    train_distributed.main()
""")


def test_flags_from_torchrun_env():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    out = distributed_flags(["data", "--cpu"], env, device_count=0)  # no CUDA: the local rank
    pairs = dict(zip(out[2::2], out[3::2]))
    assert pairs["--distributed-world-size"] == "2" and pairs["--distributed-rank"] == "1"
    assert pairs["--device-id"] == "1" and pairs["--distributed-init-method"] == "env://"
    assert pairs["--distributed-backend"] == "gloo" and pairs["--ddp-backend"] == "legacy_ddp"
    assert out[-1] == "--distributed-no-spawn"
    # GPU: fairseq's defaults (nccl, c10d DDP) are kept; user choices are never overridden
    out = distributed_flags(["data", "--ddp-backend", "no_c10d"], env)
    assert "--distributed-backend" not in out and out.count("--ddp-backend") == 1
    # no launcher, or a world of one: plain fairseq-train
    assert distributed_flags(["data", "--cpu"], {}) == ["data", "--cpu"]
    assert distributed_flags(["data"], {"RANK": "0", "WORLD_SIZE": "1"}) == ["data"]


def test_flags_refuse_contradictions():
    env = {"RANK": "0", "WORLD_SIZE": "2"}
    with pytest.raises(SystemExit, match="contradicts torchrun"):
        distributed_flags(["data", "--distributed-world-size", "4"], env)
    with pytest.raises(SystemExit, match="MASTER_ADDR"):
        distributed_flags(["data"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    out = distributed_flags(["data"], {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                                       "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert out[out.index("--distributed-rank") + 1] == "3"


def test_single_slurm_task_trains_without_master_addr(monkeypatch, tmp_path):
    """One srun task (world size 1) is plain fairseq-train: no process group, so no
    MASTER_ADDR/MASTER_PORT needed (the launcher is still worth it for the checkpoint repair);
    with more than one task they are still required."""
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
    assert distributed_flags(["data"], env) == ["data"]
    with pytest.raises(SystemExit, match="MASTER_ADDR and MASTER_PORT"):
        distributed_flags(["data"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
    with pytest.raises(SystemExit, match="MASTER_PORT"):
        distributed_flags(["data"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "MASTER_ADDR": "h"})
    # main() gets as far as fairseq's cli_main with the command line unchanged
    import fairseq_cli.train

    from mt_pipeline import launch

    seen = []
    monkeypatch.setattr(fairseq_cli.train, "cli_main", lambda: seen.append(list(sys.argv[1:])))
    # a copy of the environment: main() exports RANK/WORLD_SIZE/LOCAL_RANK, which must not leak
    launcher_keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    environ = {k: v for k, v in os.environ.items() if k not in launcher_keys and not k.startswith("SLURM_")}
    environ.update(env)
    monkeypatch.setattr(os, "environ", environ)
    argv = ["data", "--save-dir", str(tmp_path / "ck")]
    monkeypatch.setattr(sys, "argv", ["train_distributed.py", *argv])
    launch.main()
    assert seen == [argv]


def test_device_id_is_the_local_rank_modulo_the_visible_devices(monkeypatch):
    """srun --ntasks-per-node 4 --gpus-per-task 1: every task sees one device (index 0) while
    SLURM_LOCALID runs to 3, so --device-id must be 0; with 4 visible devices (torchrun on a
    4-GPU node) it stays the local rank; without CUDA it is the local rank, as before."""
    from mt_pipeline import launch

    env = {"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    dev = lambda n: (lambda out: out[out.index("--device-id") + 1])(distributed_flags(["data"], env, n))  # noqa: E731
    assert [dev(n) for n in (1, 2, 4, 0)] == ["0", "1", "3", "3"]
    # the default asks torch: CUDA available with one device -> 0; no CUDA -> the local rank
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert dev(None) == "0" and launch.device_id(3) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dev(None) == "3" and launch.device_id(3) == 3
    # a --device-id on the command line is kept
    out = distributed_flags(["data", "--device-id", "2"], env, 1)
    assert out.count("--device-id") == 1 and out[out.index("--device-id") + 1] == "2"


def test_two_ranks_one_job_equal_replicas_and_match_update_freq_2(data_bin, tmp_path):
    ddp_dir, single_dir = str(tmp_path / "ddp"), str(tmp_path / "single")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(root=th.ROOT))
    port = str(29500 + os.getpid() % 1000)
    out = th.run([TORCHRUN, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", port,
                  str(driver), *th.train_args(data_bin, ddp_dir, *EXTRA)], timeout=300)
    log = out.stdout + out.stderr
    assert "training on 2 devices" in log, log[-3000:]
    assert "distributed init (rank 0): env://" in log
    assert "training on 1 devices" not in log  # not two independent jobs
    # each update consumed 2 x 8 sentences (one batch per rank)
    assert log.count("num_updates=") == 4 and "bsz=16," in log

    r0 = torch.load(os.path.join(ddp_dir, "replica0.pt"))
    r1 = torch.load(os.path.join(ddp_dir, "replica1.pt"))
    assert r0.keys() == r1.keys()
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"replicas differ in {k}"
    saved = th.params(os.path.join(ddp_dir, "checkpoint_last.pt"))
    for k in r0:
        assert torch.equal(saved[k], r0[k]), k

    th.run([os.path.join(th.BIN, "fairseq-train"),
            *th.train_args(data_bin, single_dir, *EXTRA, "--update-freq", "2")], timeout=300)
    single = th.params(os.path.join(single_dir, "checkpoint_last.pt"))
    diff = max((single[k] - r0[k]).abs().max().item() for k in r0)
    print(f"max |single(update-freq 2) - ddp(2 ranks)| over parameters = {diff:.3g}")
    assert diff <= ATOL, diff

    # the comparison can fail: one rank's batches alone (update-freq 1) give other parameters
    half_dir = str(tmp_path / "half")
    th.run([os.path.join(th.BIN, "fairseq-train"), *th.train_args(data_bin, half_dir, *EXTRA)], timeout=300)
    half = th.params(os.path.join(half_dir, "checkpoint_last.pt"))
    assert max((half[k] - r0[k]).abs().max().item() for k in r0) > 100 * ATOL
