"""Which kernels compute an attention function's fused path: PyTorch or the fused Triton kernels.

``--attention-backend`` (``args.attention_backend`` of
:func:`~fairseq_plugins.attention.functions.build_attention_fn`), one of :data:`BACKENDS`:

* ``auto`` (default): ``triton`` on CUDA tensors when the ``triton`` package imports, else ``torch``;
* ``torch``: the PyTorch path (the reference; the only one on CPU): plain
  ``matmul -> act -> matmul`` for the rectified family, the chunked CPU kernel
  (:mod:`~fairseq_plugins.attention.kernels`) for ReLUFormer, ``torch.cdist`` + softmax for E-ATT;
* ``triton``: the fused kernels of :mod:`fairseq_plugins.attention.triton` -- compiled on CUDA,
  Triton's interpreter on CPU tensors when ``TRITON_INTERPRET=1`` (for tests); otherwise an error.

The backend matters only where a function has a fused path and the caller does not need the
weights: ``softmax`` always uses ``F.scaled_dot_product_attention`` (already FlashAttention on
CUDA), sparsemax/entmax/Synthesizer/flexible have no fused path, and any call that needs the
weights (``need_weights``, analysis capture, ``--attention-entropy`` in validation, beam-folded
cross-attention) takes the score/normalize path whatever the backend.  The resolved choice is
logged once per (requested, resolved, device type).

``auto`` guards against kernels that do not compile or disagree on an untested GPU / triton
version: before its first Triton call per (kernel family, device, dtype) it runs
:func:`fairseq_plugins.attention.triton.self_test` (a small forward + backward against the
PyTorch reference, a few seconds of compilation) and, if that fails, logs a warning with the
reason and stays on ``torch`` for that family.  ``triton`` runs no check: errors surface.
"""

import logging
from typing import Dict, Optional, Set, Tuple

import torch

__all__ = ["BACKENDS", "DEFAULT_BACKEND", "check_backend", "resolve_backend"]

logger = logging.getLogger(__name__)

#: valid values of ``--attention-backend``
BACKENDS = ("auto", "torch", "triton")
DEFAULT_BACKEND = "auto"
_LOGGED: Set[Tuple[str, str, str]] = set()
#: (family, device, dtype) -> None (kernels passed :func:`self_test`) or the failure reason
_CHECKED: Dict[Tuple[str, str, torch.dtype], Optional[str]] = {}


def check_backend(name) -> str:
    """``name`` (None -> :data:`DEFAULT_BACKEND`) if it is one of :data:`BACKENDS`.

    Raises:
        ValueError: an unknown name; the message lists the valid choices.
    """
    name = DEFAULT_BACKEND if name is None else name
    if name not in BACKENDS:
        raise ValueError(f"--attention-backend {name!r}; valid choices: {', '.join(BACKENDS)}")
    return name


def _passes_self_test(family: str, device: torch.device, dtype: torch.dtype) -> bool:
    from . import triton as tk

    key = (family, str(device), dtype)
    if key not in _CHECKED:
        _CHECKED[key] = tk.self_test(family, device, dtype)
        if _CHECKED[key] is not None:
            logger.warning("--attention-backend auto: the Triton %s kernels failed their start-up "
                           "check on %s %s (%s); using the PyTorch path for them",
                           family, device, dtype, _CHECKED[key])
    return _CHECKED[key] is None


def resolve_backend(name: str, device: torch.device, family: Optional[str] = None,
                    dtype: Optional[torch.dtype] = None) -> str:
    """The backend (``"torch"`` or ``"triton"``) that runs requested backend ``name`` on ``device``.

    ``family`` (one of :data:`fairseq_plugins.attention.triton.FAMILIES`) and ``dtype``: with
    ``auto`` on CUDA, the Triton kernels of that family must first pass their start-up check
    (see the module docstring); without a family no check is made.

    Raises:
        ValueError: unknown ``name``.
        RuntimeError: ``name == "triton"`` but the ``triton`` package does not import, or the
            device is not CUDA and ``TRITON_INTERPRET=1`` is not set (the message names it).
    """
    from . import triton as tk

    name = check_backend(name)
    device = torch.device(device)
    if name == "torch":
        chosen = "torch"
    elif name == "auto":
        chosen = "triton" if device.type == "cuda" and tk.triton_available() else "torch"
        if chosen == "triton" and family is not None and dtype is not None:
            chosen = "triton" if _passes_self_test(family, device, dtype) else "torch"
    else:
        if not tk.triton_available():
            raise RuntimeError("--attention-backend triton needs the 'triton' package "
                               "(pip install -e .[gpu]); valid choices: " + ", ".join(BACKENDS))
        if device.type != "cuda" and not tk.interpret_requested():
            raise RuntimeError(f"--attention-backend triton on a {device.type} tensor needs "
                               f"TRITON_INTERPRET=1 (Triton's interpreter: slow, for tests); "
                               f"use --attention-backend torch or auto on {device.type} (for a "
                               f"checkpoint trained with triton: --model-overrides "
                               f"\"{{'attention_backend': 'auto'}}\")")
        chosen = "triton"
    key = (name, chosen, device.type)
    if key not in _LOGGED:
        _LOGGED.add(key)
        mode = " (interpreter)" if chosen == "triton" and tk.interpret_requested() else ""
        logger.info("attention backend: %s%s on %s (--attention-backend %s)", chosen, mode,
                    device.type, name)
    return chosen
