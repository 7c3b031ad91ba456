"""Triton helpers shared by the kernel files: local versions of ``tl.sum`` / ``tl.max``.

Loaded like the kernel files (never imported directly): ``_kernels.py``, ``_norm_kernels.py`` and
``_stats_kernels.py`` each load it in their own mode with
:func:`fairseq_plugins.attention.triton.load_kernel_module`, so a compiled kernel calls the
compiled helpers and an interpreted one the interpreted helpers (see the package docstring: a
``@triton.jit`` function exists in the mode its file was executed in).  ``tl.sum`` and ``tl.max``
are Triton's own ``@jit`` library functions, which exist in one mode only; these are not.
"""

import triton
import triton.language as tl

from . import kernel_mode

INTERPRET = kernel_mode()


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


if INTERPRET:
    # the interpreter reduces with numpy when the combine function *is* triton's own (compared by
    # identity, never called); any other one is applied element by element (~10x slower)
    from triton.language import standard as _std

    _SUM_COMBINE = getattr(_std, "_sum_combine", _add)
    _MAX_COMBINE = getattr(_std, "_elementwise_max", _maximum)
else:
    _SUM_COMBINE = _add
    _MAX_COMBINE = _maximum


@triton.jit
def rowsum(x, AXIS: tl.constexpr):
    """``tl.sum(x, AXIS)``."""
    return tl.reduce(x, AXIS, _SUM_COMBINE)


@triton.jit
def rowmax(x, AXIS: tl.constexpr):
    """``tl.max(x, AXIS)``."""
    return tl.reduce(x, AXIS, _MAX_COMBINE)
