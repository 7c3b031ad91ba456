#!/usr/bin/env python
"""``fairseq-train`` as one data-parallel job under ``torchrun`` or SLURM ``srun``.

Why this exists.  ``torchrun --nproc_per_node N $(which fairseq-train) ... --cpu`` starts N
*independent* single-process jobs with fairseq 0.12 (``fairseq.distributed.utils``):

* ``--distributed-world-size`` defaults to ``max(1, torch.cuda.device_count())`` -- 1 on a CPU
  (or one-GPU-per-node) machine -- and ``infer_init_method`` returns at once when it is 1,
  before it looks at torchrun's ``RANK``/``WORLD_SIZE``; every process trains alone and all of
  them write the same ``--save-dir``.
* with ``--distributed-world-size N`` given, fairseq's torchrun path
  (``_infer_torch_distributed_launch_init``) sets ``device_id = rank % torch.cuda.device_count()``,
  a ``ZeroDivisionError`` without a GPU; and passing only ``--distributed-init-method env://``
  leaves ``--distributed-rank`` at 0 in every process.
* ``--ddp-backend pytorch_ddp`` (the default ``c10d``) hands ``device_ids=[device_id]`` to torch's
  ``DistributedDataParallel``, which refuses that for CPU modules.

Before training, rank 0 repairs a ``checkpoint_last.pt`` torn by a kill during fairseq's
non-atomic copy (:func:`fairseq_plugins.checkpoint.repair_last_checkpoint`), so re-running
the same command after a crash always resumes; this makes it worth using for one process too.

This launcher maps the launcher's environment to fairseq's documented flags and then runs
fairseq's own ``fairseq_cli.train.cli_main`` (fairseq is not patched):

    --distributed-world-size $WORLD_SIZE --distributed-rank $RANK
    --device-id $(( LOCAL_RANK % number of visible CUDA devices ))   (LOCAL_RANK without CUDA)
    --distributed-init-method env:// --distributed-no-spawn
    (+ with --cpu, unless given: --distributed-backend gloo --ddp-backend legacy_ddp)

With a world size of 1 nothing is added: one process trains alone (plain fairseq-train, plus the
checkpoint repair above).  The device id is taken modulo the visible devices because
``srun --ntasks-per-node N --gpus-per-task 1`` shows each task one device (index 0) while its
``SLURM_LOCALID`` runs to N-1.

Environment read: torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (+ ``MASTER_ADDR``,
``MASTER_PORT``, read by torch's ``env://``); or, under ``srun`` without torchrun,
``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` (with more than one task ``MASTER_ADDR``/
``MASTER_PORT`` must then be exported by the batch script -- a port per job, e.g.
``$((10000 + SLURM_JOB_ID % 50000))``, so that two jobs on one node do not collide).  Without
either, it is plain ``fairseq-train``.

Usage::

    torchrun --nproc_per_node 2 scripts/train_distributed.py DATA --user-dir fairseq_plugins \
        --arch reluformer_small ... [--cpu]

Raises SystemExit (before any training) when a ``--distributed-*`` flag on the command line
contradicts the launcher's environment, or when SLURM started more than one task without
``MASTER_ADDR``/``MASTER_PORT``.
"""

import os
import sys

__all__ = ["device_id", "distributed_flags", "main"]


def _given(argv, flag):
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _value(argv, flag):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def launcher_env(env):
    """``(rank, world_size, local_rank, source)`` from the launcher's variables, else None.

    torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (source ``"torchrun"``) take precedence over
    SLURM's ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID`` (source ``"slurm"``; torchrun run
    inside an ``srun`` task sees both).  A missing local rank is 0.  Nothing is checked here: see
    :func:`require_master` for the rendezvous variables a SLURM job of several tasks needs.
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)), "torchrun"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return (int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]),
                int(env.get("SLURM_LOCALID", 0)), "slurm")
    return None


def require_master(env, world, source):
    """Exit unless ``MASTER_ADDR`` and ``MASTER_PORT`` are in ``env`` when ``srun`` (``source``
    ``"slurm"``) started ``world`` > 1 tasks: torch's ``env://`` rendezvous reads them and
    ``srun``, unlike torchrun, does not set them.  A single task (``world`` <= 1) trains without
    a process group and needs neither; under torchrun torchrun sets them.

    Raises:
        SystemExit: SLURM with a world size above 1 and either variable missing; the message
            says how to export them (the port derived from ``SLURM_JOB_ID``, so that two jobs
            sharing a node do not collide).
    """
    if source != "slurm" or world <= 1:
        return
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        sys.exit(f"train_distributed: running under srun with {world} tasks but {' and '.join(missing)} not set; "
                 "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) and "
                 "MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000)) (a port per job) in the batch script "
                 "(or launch with torchrun)")


def device_id(local_rank, device_count=None):
    """The CUDA device index of the process with local rank ``local_rank``: ``local_rank``
    modulo the number of CUDA devices this process sees, so that ``srun --ntasks-per-node N
    --gpus-per-task 1`` (each task sees one device, index 0, while ``SLURM_LOCALID`` runs to
    N-1) does not ask for an invalid device ordinal.  With as many visible devices as local
    ranks (torchrun on an N-GPU node) it is ``local_rank`` itself; with fewer, several ranks
    share a device (fairseq's own torchrun path does the same).

    Args:
        local_rank: the launcher's local rank (``LOCAL_RANK`` / ``SLURM_LOCALID``).
        device_count: visible CUDA devices; None asks torch (0 when CUDA is not available).

    Returns:
        ``local_rank % device_count``, or ``local_rank`` unchanged when no CUDA device is
        visible (a CPU run, where fairseq does not use the device id).
    """
    if device_count is None:
        import torch

        device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return local_rank % device_count if device_count > 0 else local_rank


def distributed_flags(argv, env, device_count=None):
    """fairseq-train arguments ``argv`` plus the flags that make this process one rank of the job.

    The flags added (each only when not already on the command line): ``--distributed-world-size``,
    ``--distributed-rank``, ``--device-id`` (:func:`device_id`: the local rank modulo the visible
    CUDA devices), ``--distributed-init-method env://`` and ``--distributed-no-spawn``; with
    ``--cpu`` also ``--distributed-backend gloo --ddp-backend legacy_ddp``.

    Args:
        argv: fairseq-train's command line (without the program name).
        env: the environment (``os.environ``).
        device_count: visible CUDA devices for ``--device-id``; None asks torch.

    Returns:
        A new argument list: ``argv`` unchanged when not launched by torchrun/srun or when the
        world size is 1 (one process trains alone, under SLURM without ``MASTER_ADDR``/
        ``MASTER_PORT`` too).

    Raises:
        SystemExit: ``--distributed-world-size``/``--distributed-rank`` on the command line
            differ from the launcher's; or SLURM with more than one task without
            ``MASTER_ADDR``/``MASTER_PORT`` (:func:`require_master`).
    """
    found = launcher_env(env)
    if found is None:
        return list(argv)
    rank, world, local_rank, source = found
    if world <= 1:
        return list(argv)
    require_master(env, world, source)
    for flag, want in (("--distributed-world-size", world), ("--distributed-rank", rank)):
        got = _value(argv, flag)
        if got is not None and int(got) != want:
            sys.exit(f"train_distributed: {flag} {got} contradicts {source} ({flag[2:]} = {want}); "
                     f"drop the flag, the launcher sets it")
    out = [a for a in argv]
    add = {"--distributed-world-size": str(world), "--distributed-rank": str(rank),
           "--device-id": str(device_id(local_rank, device_count)), "--distributed-init-method": "env://"}
    if "--cpu" in argv:
        add["--distributed-backend"] = "gloo"
        add["--ddp-backend"] = "legacy_ddp"  # torch DDP refuses device_ids for CPU modules
    for flag, value in add.items():
        if not _given(out, flag):
            out += [flag, value]
    if "--distributed-no-spawn" not in out:
        out.append("--distributed-no-spawn")  # the launcher made the processes
    return out


def main():
    """Run fairseq-train on ``sys.argv[1:]`` as this process's rank of the launcher's job.

    Adds :func:`distributed_flags`; under SLURM also exports ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``
    (when not set) for torch's ``env://``; on rank 0 (or without a launcher) first repairs a torn
    ``checkpoint_last.pt`` in ``--save-dir`` (default ``checkpoints``); then calls
    ``fairseq_cli.train.cli_main``.

    Raises:
        SystemExit: as :func:`distributed_flags`, before anything is repaired or trained; and
            whatever fairseq-train raises or exits with.
    """
    argv = distributed_flags(sys.argv[1:], os.environ)
    found = launcher_env(os.environ)
    if found is not None and found[3] == "slurm":
        # torch's env:// reads RANK/WORLD_SIZE besides the explicit arguments fairseq passes
        for key, value in zip(("RANK", "WORLD_SIZE", "LOCAL_RANK"), found[:3]):
            os.environ.setdefault(key, str(value))
    if found is None or found[0] == 0:  # one process repairs the shared --save-dir
        from fairseq_plugins.checkpoint import repair_last_checkpoint

        repair_last_checkpoint(_value(argv, "--save-dir") or "checkpoints")
    sys.argv = [sys.argv[0]] + argv
    from fairseq_cli.train import cli_main

    cli_main()


if __name__ == "__main__":
    main()
