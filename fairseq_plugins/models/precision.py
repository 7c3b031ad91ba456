"""Start-up check of fairseq's half-precision training flags against the machine.

fairseq fails deep inside its ``Trainer`` on a machine that cannot honour them:

* ``--fp16`` / ``--memory-efficient-fp16``: ``FP16Optimizer.build_fp32_params`` puts the fp32
  master weights on ``torch.cuda.current_device()`` -- on a CPU-only machine "Torch not
  compiled with CUDA enabled" (or "no NVIDIA driver"), raised while the trainer loads the
  checkpoint, after the model, criterion and data were built;
* ``--bf16`` / ``--memory-efficient-bf16``: ``fairseq-train`` sets ``--tpu`` whenever ``--bf16``
  is given (``fairseq/options.py``, ``parse_args_and_arch``), and ``Trainer.__init__`` then asks
  ``torch_xla`` for an XLA device: without ``torch_xla`` it dies with ``'NoneType' object has no
  attribute 'xla_device'`` -- on a CUDA GPU as well (fairseq issue #4696).
  ``fairseq-hydra-train`` with ``common.bf16=true`` does not set ``tpu``; there bf16 needs a
  CUDA GPU, as fp16 does (the same ``FP16Optimizer``).

The plugin's models call :func:`check_precision_flags` from ``build_model``: the first plugin
code fairseq runs with the configuration, before the ``Trainer`` is built.  ``build_model`` is
also how fairseq rebuilds a model from a checkpoint (whose stored args keep the training's
``--fp16``/``--bf16``), so the check applies only when the model is built by
``fairseq_cli.train.main`` -- found on the call stack, where its ``cfg`` (the whole
configuration, ``common.*`` included) is read; fairseq is not patched.
"""

import os
import sys
from typing import Optional

import torch

__all__ = ["check_precision_flags", "training_config"]


def training_config() -> Optional[object]:
    """The configuration of the ``fairseq_cli.train.main`` call on the current call stack (the
    ``cfg`` local of that frame: a ``FairseqConfig`` DictConfig, or the argparse Namespace it
    was given), or None when the caller is not fairseq's training entry point (generation,
    checkpoint loading, tests building a model)."""
    target = os.path.join("fairseq_cli", "train.py")
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(target):
            return frame.f_locals.get("cfg")
        frame = frame.f_back
    return None


def _common(cfg, name: str):
    common = getattr(cfg, "common", None)
    return bool(getattr(common if common is not None else cfg, name, False) or False)


def _has_torch_xla() -> bool:
    try:
        import torch_xla.core.xla_model  # noqa: F401
    except Exception:
        return False
    return True


def check_precision_flags() -> None:
    """Refuse ``--fp16`` / ``--bf16`` (and their ``--memory-efficient-*`` forms) at start-up
    when fairseq could not train with them on this machine.  A no-op unless the model is being
    built for training by ``fairseq_cli.train.main`` (:func:`training_config`).

    Raises:
        ValueError: ``--fp16`` without a usable CUDA GPU (none visible, or ``--cpu``);
            ``--bf16`` as fairseq-train reads it (``--tpu`` implied) without ``torch_xla``;
            ``common.bf16`` without ``tpu`` and without a usable CUDA GPU.  The message names
            the flag, why fairseq cannot run it here, and what to do instead.
    """
    cfg = training_config()
    if cfg is None:
        return
    fp16 = _common(cfg, "fp16") or _common(cfg, "memory_efficient_fp16")
    bf16 = _common(cfg, "bf16") or _common(cfg, "memory_efficient_bf16")
    cpu, tpu = _common(cfg, "cpu"), _common(cfg, "tpu")
    cuda = torch.cuda.is_available() and not cpu
    where = "--cpu is given" if cpu else "this machine has no CUDA GPU (torch.cuda.is_available() is False)"
    if fp16 and not cuda:
        raise ValueError(
            f"--fp16 needs a CUDA GPU and {where}: fairseq's FP16Optimizer keeps the fp32 master "
            "weights on torch.cuda.current_device(). Drop --fp16 (and --memory-efficient-fp16) to "
            "train in float32 on the CPU.")
    if bf16 and tpu and not _has_torch_xla():
        if cuda:
            raise ValueError(
                "--bf16 in fairseq-train implies --tpu (fairseq/options.py) and trains on an XLA "
                "device, which needs torch_xla (not installed); fairseq's Trainer would fail with "
                "\"'NoneType' object has no attribute 'xla_device'\" even on this CUDA GPU (fairseq "
                "issue #4696). On a CUDA GPU use --fp16 or --amp, or fairseq-hydra-train with "
                "common.bf16=true (which does not imply tpu; with configs/hydra's CPU examples also "
                "common.cpu=false).")
        raise ValueError(
            f"--bf16 needs a GPU or TPU and {where}: fairseq-train's --bf16 implies --tpu "
            "(fairseq/options.py) and needs torch_xla (not installed); bf16 on a CUDA GPU needs "
            "fairseq-hydra-train with common.bf16=true (and common.cpu=false). Drop --bf16 (and "
            "--memory-efficient-bf16) to train in float32 on the CPU.")
    if bf16 and not tpu and not cuda:
        raise ValueError(
            f"bf16 training needs a CUDA GPU and {where}: fairseq's FP16Optimizer (used for bf16 "
            "too) keeps the fp32 master weights on torch.cuda.current_device(). "
            + ("On a CUDA GPU set common.cpu=false (configs/hydra's examples set cpu: true); or set "
               if cpu and torch.cuda.is_available() else "Set ")
            + "common.bf16=false to train in float32 on the CPU.")
