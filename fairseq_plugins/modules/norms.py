"""Normalisation layers used by rectified linear attention (ReLA).

Shapes: ``(..., C)`` with ``C`` the normalised (model) dimension; every layer here
normalises over the last axis and is shape-preserving.

Source: Zhang, Titov & Sennrich (2021), "Sparse Attention with Linear Units" (ReLA),
Section 4, eqs. 4-5; RMSNorm from Zhang & Sennrich (2019).  The released ReLA code
(bzhangGo/zero, ``modules/rela.py``) computes ``g * x * rsqrt(mean(x^2) + eps) *
sigmoid(w * x)`` with ``eps = 1e-8``: the gate multiplies the *un-normalised* input.

The RMSNorm of eq. 4 and the gated norm of eq. 5 run through one fused op,
:func:`gated_rms_norm` (a ``torch.autograd.Function``): it keeps only the input ``z`` (in its
own dtype) and the per-group ``rstd`` (float32, ``(..., groups)``) for backward and recomputes
``zhat`` and the gate there, instead of the ~5 activation-sized intermediates autograd would
keep.  On CUDA with the Triton backend (``--attention-backend``) the op is one Triton kernel
each way (:mod:`fairseq_plugins.attention.triton.norm`); the PyTorch path is the reference.
The LayerNorm variant (ReLA Table 1 row 8, :class:`GroupedLayerNorm` under :class:`GatedNorm`)
stays on torch's own ops.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["RMSNorm", "GatedNorm", "GroupedLayerNorm", "NORM_SCOPES", "gated_rms_norm", "NORM_BACKENDS"]

#: Where ReLA's norm computes its statistics (``--rela-norm-scope``): ``concat`` over the
#: concatenated heads (``C`` wide; ReLA Section 4: "In the multihead ReLA, we impose the
#: normalization LN(.) on the concatenated head representation rather than each single head
#: separately", and the released code, bzhangGo/zero ``modules/rela.py``) or ``head`` over each
#: head's ``d_h`` values (eq. 4's one-head notation, ``z, g in R^{d_h}``, read per head: a variant,
#: not the paper's method).  Both have ``C`` gains, so their checkpoints have the same layout.
NORM_SCOPES = ("concat", "head")
#: kernels of :func:`gated_rms_norm`: the PyTorch ops (any device) or the fused Triton kernels
NORM_BACKENDS = ("torch", "triton")


def _check_groups(dim: int, groups: int) -> None:
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or dim % groups:
        raise ValueError(f"groups={groups!r} must be a positive int dividing dim={dim}")


def _grouped(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``(..., C)`` -> ``(..., groups, C / groups)`` (a view)."""
    return x if groups == 1 else x.unflatten(-1, (groups, x.size(-1) // groups))


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the statistics and of the arithmetic: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_norm_args(z, weight, gate, eps, groups) -> None:
    """Argument checks shared by both backends of :func:`gated_rms_norm` (ValueError)."""
    if not torch.is_tensor(z) or not z.is_floating_point() or z.dim() < 1:
        raise ValueError(f"z must be a floating-point tensor (..., C), got "
                         f"{type(z).__name__ if not torch.is_tensor(z) else (z.dtype, tuple(z.shape))}")
    C = z.size(-1)
    for name, p in (("weight", weight), ("gate", gate)):
        if p is None and name == "gate":
            continue
        if not torch.is_tensor(p) or tuple(p.shape) != (C,) or not p.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor of shape ({C},), got "
                             f"{tuple(p.shape) if torch.is_tensor(p) else type(p).__name__}")
        if p.device != z.device:
            raise ValueError(f"{name} is on {p.device}, z on {z.device}")
    _check_groups(C, groups)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")


def _out_dtype(z, weight, gate) -> torch.dtype:
    """The dtype the unfused modules returned: ``z``'s promoted with the parameters'."""
    dt = torch.promote_types(z.dtype, weight.dtype)
    return dt if gate is None else torch.promote_types(dt, gate.dtype)


class _GatedRMSNorm(torch.autograd.Function):
    """PyTorch path of :func:`gated_rms_norm`.  Saves ``z`` (its own dtype), ``rstd``
    ``(..., groups)`` (float32; float64 for float64 ``z``) and the parameters; backward
    recomputes ``zhat = z rstd`` and ``s = sigmoid(w z)``.

    Gradients (``n = C / groups`` values per group, means over the group of ``z_i``;
    ``dy`` the incoming gradient; without the gate ``s = 1`` and the ``w`` terms vanish)::

        u   = dy s g                                   (gradient w.r.t. zhat)
        dz  = rstd (u - zhat mean(u zhat)) + dy g zhat s (1 - s) w
        dg  = sum_rows dy s zhat
        dw  = sum_rows dy g zhat s (1 - s) z
    """

    @staticmethod
    def forward(ctx, z, weight, gate, eps, groups):
        acc = _stat_dtype(z.dtype)
        zf = z.to(acc)
        zg = zf.unflatten(-1, (groups, zf.size(-1) // groups))
        rstd = torch.rsqrt(zg.square().mean(-1) + eps)  # (..., groups)
        y = (zg * rstd.unsqueeze(-1)).flatten(-2) * weight.to(acc)
        if gate is not None:
            y = y * torch.sigmoid(gate.to(acc) * zf)
        ctx.save_for_backward(z, rstd, weight, gate)
        ctx.groups = groups
        return y.to(_out_dtype(z, weight, gate))

    @staticmethod
    def backward(ctx, dy):
        z, rstd, weight, gate = ctx.saved_tensors
        return _gated_rms_norm_backward(dy, z, rstd, weight, gate, ctx.groups, ctx.needs_input_grad) \
            + (None, None)


def _gated_rms_norm_backward(dy, z, rstd, weight, gate, groups, needs):
    """``(dz, dweight, dgate)`` of :class:`_GatedRMSNorm` (None where not needed)."""
    acc = rstd.dtype
    C = z.size(-1)
    zf = z.to(acc)
    zhat = (zf.unflatten(-1, (groups, C // groups)) * rstd.unsqueeze(-1)).flatten(-2)
    dyf = dy.to(acc)
    g = weight.to(acc)
    if gate is not None:
        s = torch.sigmoid(gate.to(acc) * zf)
        dys = dyf * s
    else:
        dys = dyf
    dz = dg = dw = None
    if needs[1]:
        dg = (dys * zhat).reshape(-1, C).sum(0).to(weight.dtype)
    if gate is not None and (needs[0] or needs[2]):
        t = dyf * g * zhat * s * (1 - s)  # gradient w.r.t. w z
        if needs[2]:
            dw = (t * zf).reshape(-1, C).sum(0).to(gate.dtype)
    if needs[0]:
        u = (dys * g).unflatten(-1, (groups, C // groups))
        zh = zhat.unflatten(-1, (groups, C // groups))
        dz = (rstd.unsqueeze(-1) * (u - zh * (u * zh).mean(-1, keepdim=True))).flatten(-2)
        if gate is not None:
            dz = dz + t * gate.to(acc)
        dz = dz.to(z.dtype)
    return dz, dg, dw


def _gated_rms_norm_inference(z, weight, gate, eps, groups):
    """Forward of :class:`_GatedRMSNorm` for inference (no gradient wanted; ``z``, ``weight`` and
    ``gate`` of one float32/float64 dtype, so the arithmetic dtype is ``z``'s own): torch's
    ``rms_norm`` and the gate, with no autograd node, nothing saved and no dtype conversions --
    a decoding step on CPU is bound by per-op overhead, and this is about a third of the
    training op's dispatches."""
    C = z.size(-1)
    if groups == 1:
        y = F.rms_norm(z, (C,), weight, eps)
    else:
        y = F.rms_norm(z.unflatten(-1, (groups, C // groups)), (C // groups,), None, eps).flatten(-2) * weight
    return y if gate is None else y * torch.sigmoid(gate * z)


def _inference_ok(z, weight, gate) -> bool:
    """True when :func:`_gated_rms_norm_inference` gives the op's result: no gradient is wanted
    and every tensor is float32 (or every one float64)."""
    if z.dtype not in (torch.float32, torch.float64) or weight.dtype != z.dtype:
        return False
    if gate is not None and gate.dtype != z.dtype:
        return False
    return not (torch.is_grad_enabled() and (z.requires_grad or weight.requires_grad
                                              or (gate is not None and gate.requires_grad)))


def gated_rms_norm(z: torch.Tensor, weight: torch.Tensor, gate=None, eps: float = 1e-8,
                   groups: int = 1, backend: str = "torch") -> torch.Tensor:
    """ReLA's RMSNorm (eq. 4) or gated RMSNorm (ReLA-g, eq. 5) as one fused op::

        rstd = 1 / sqrt(mean_group(z^2) + eps)           per row and group of C / groups values
        y    = (z rstd) g                                (eq. 4, gate=None)
        y    = sigmoid(w z) (z rstd) g                   (eq. 5, gate=w)

    Args:
        z: ``(..., C)``, float16/bfloat16/float32/float64 (the concatenated heads, ``(T, B, C)``).
        weight: the gain ``g``, ``(C,)``.
        gate: the gate weight ``w``, ``(C,)``, or None (plain RMSNorm).
        eps: added to the mean square (released ReLA code: 1e-8); a zero row (null attention)
            stays exactly zero, with finite gradients (``rstd = eps^-1/2`` there).
        groups: ``1`` (statistics over all ``C`` values) or ``H`` (per head; any divisor of ``C``).
        backend: ``"torch"`` (PyTorch ops, any device; the reference) or ``"triton"`` (the fused
            kernels of :mod:`fairseq_plugins.attention.triton.norm`: CUDA, or CPU under
            ``TRITON_INTERPRET=1``).

    Statistics and arithmetic are float32 for float16/bfloat16/float32 ``z`` (float64 for
    float64), rounded once to the output dtype: ``z``'s dtype promoted with the parameters'
    (what the unfused modules returned).  For backward only ``z``, ``rstd`` ``(..., groups)`` and
    the parameters are kept.  When no gradient is wanted (``torch.no_grad()``, or no input
    requiring one) and all three tensors are float32 (or all float64), the torch backend runs
    torch's ``rms_norm`` and the gate instead (:func:`_gated_rms_norm_inference`: the same values
    to rounding, fewer ops per decoding step).

    Returns:
        ``y``, ``(..., C)``.

    Raises:
        ValueError: ``z`` not floating point, ``weight``/``gate`` not ``(C,)`` or on another
            device, ``groups`` not a positive divisor of ``C``, ``eps`` not a finite number > 0,
            unknown ``backend`` (valid: ``torch``, ``triton``); the Triton backend's own checks.
        RuntimeError: ``backend="triton"`` without triton, or on a non-CUDA tensor without
            ``TRITON_INTERPRET=1``.
    """
    if backend not in NORM_BACKENDS:
        raise ValueError(f"backend={backend!r}; valid choices: {', '.join(NORM_BACKENDS)}")
    _check_norm_args(z, weight, gate, eps, groups)
    if backend == "triton":
        from ..attention.triton.norm import apply_checked

        return apply_checked(z, weight, gate, float(eps), groups)
    if _inference_ok(z, weight, gate):
        return _gated_rms_norm_inference(z, weight, gate, float(eps), groups)
    return _GatedRMSNorm.apply(z, weight, gate, float(eps), groups)


class RMSNorm(nn.Module):
    """Root-mean-square layer normalisation, ReLA eq. 4: ``RMSNorm(z) = z / RMS(z) ⊙ g``.

    Args:
        dim: size ``C`` of the last axis.
        eps: added to ``mean(z^2)`` before the reciprocal square root (released ReLA
            code: 1e-8). A zero row (null attention) therefore stays exactly zero.
        gain_init: ``"ones"`` (the usual RMSNorm initialisation, ReLA Table 1 row 5) or
            ``"xavier"``: ``g ~ U(-sqrt(3/fan), sqrt(3/fan))`` (ReLA-i, Section 4, with
            fan_in = fan_out = ``fan``, which the paper sets to ``d_h``).
        fan: the fan used by ``gain_init="xavier"``; required then.
        groups: ``1`` (statistics over all ``C`` values) or ``H``: ``RMS`` per group of
            ``C / H`` values, i.e. per head (``--rela-norm-scope head``, :data:`NORM_SCOPES`).
            The gain has ``C`` entries either way (``g in R^{d_h}`` per head).

    Shape: input ``(..., C)`` -> output ``(..., C)``.

    Raises:
        ValueError: unknown ``gain_init`` (valid: ``ones``, ``xavier``), missing ``fan``, or
            ``groups`` not a positive divisor of ``dim``.
    """

    GAIN_INITS = ("ones", "xavier")

    def __init__(self, dim: int, eps: float = 1e-8, gain_init: str = "ones", fan: int = None,
                 groups: int = 1):
        super().__init__()
        if gain_init not in self.GAIN_INITS:
            raise ValueError(f"gain_init={gain_init!r}; valid choices: {', '.join(self.GAIN_INITS)}")
        if gain_init == "xavier" and not fan:
            raise ValueError("gain_init='xavier' needs fan (ReLA-i uses fan = d_h)")
        _check_groups(dim, groups)
        self.dim, self.eps, self.gain_init, self.fan, self.groups = dim, eps, gain_init, fan, groups
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self):
        if self.gain_init == "ones":
            nn.init.ones_(self.weight)
        else:
            bound = math.sqrt(3.0 / self.fan)
            nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """``(..., C)`` -> ``(..., C)`` through :func:`gated_rms_norm` (statistics in float32 at
        least, so bf16/fp16 inputs do not under/overflow); ``backend``: ``torch`` or ``triton``."""
        return gated_rms_norm(x, self.weight, None, self.eps, self.groups, backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, gain_init={self.gain_init}, groups={self.groups}"


class GatedNorm(nn.Module):
    """Gated normalisation of ReLA-g, eq. 5: ``LN(z) = sigmoid(w ⊙ z) ⊙ Norm(z)``.

    ``Norm`` is :class:`RMSNorm` (gain init 1; ReLA-g, Table 1 row 7) or
    ``torch.nn.LayerNorm`` (Table 1 row 8, "7 + LayerNorm").  The gate weight ``w`` is
    initialised ``U(-sqrt(3/C), sqrt(3/C))`` (Glorot for a vector, as in the released code).

    Args:
        dim: size ``C`` of the last axis (``d_model``: ReLA normalises the concatenated heads).
        norm: ``"rmsnorm"`` or ``"layernorm"``.
        eps: epsilon of the inner norm.
        groups: statistics per group of ``C / groups`` values (``H`` = per head, see
            :class:`RMSNorm`); the gate acts elementwise and is the same for every scope.

    Shape: ``(..., C)`` -> ``(..., C)``.

    Raises:
        ValueError: unknown ``norm`` (valid: ``rmsnorm``, ``layernorm``) or bad ``groups``.
    """

    NORMS = ("rmsnorm", "layernorm")

    def __init__(self, dim: int, norm: str = "rmsnorm", eps: float = 1e-8, groups: int = 1):
        super().__init__()
        if norm not in self.NORMS:
            raise ValueError(f"norm={norm!r}; valid choices: {', '.join(self.NORMS)}")
        _check_groups(dim, groups)
        self.norm = RMSNorm(dim, eps=eps, groups=groups) if norm == "rmsnorm" else \
            GroupedLayerNorm(dim, eps=max(eps, 1e-5), groups=groups)
        self.gate = nn.Parameter(torch.empty(dim))
        bound = math.sqrt(3.0 / dim)
        nn.init.uniform_(self.gate, -bound, bound)

    @property
    def fused(self) -> bool:
        """True for the RMSNorm variant, which runs as one op (:func:`gated_rms_norm`, with a
        Triton kernel); the LayerNorm variant stays on torch's ops."""
        return isinstance(self.norm, RMSNorm)

    def forward(self, x: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """``(..., C)`` -> ``(..., C)``; ``backend`` (``torch``/``triton``) applies to the RMSNorm
        variant (:func:`gated_rms_norm`) and is ignored by the LayerNorm one."""
        if self.fused:
            n = self.norm
            return gated_rms_norm(x, n.weight, self.gate, n.eps, n.groups, backend)
        return torch.sigmoid(self.gate * x) * self.norm(x)


class GroupedLayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last axis, or over each of ``groups`` equal slices of it
    (per head: ReLA Table 1 row 8 with ``--rela-norm-scope head``).  Same parameters
    (``weight``, ``bias`` of size ``C``) and state-dict keys as ``nn.LayerNorm(C)``.

    Shape: ``(..., C)`` -> ``(..., C)``.

    Raises:
        ValueError: ``groups`` not a positive divisor of ``dim``.
    """

    def __init__(self, dim: int, eps: float = 1e-5, groups: int = 1):
        super().__init__(dim, eps=eps)
        _check_groups(dim, groups)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., C)`` -> ``(..., C)``: ``nn.LayerNorm`` over all ``C`` values (``groups == 1``), else
        ``F.layer_norm`` over each group of ``C / groups`` values followed by the ``C``-wide
        ``weight`` and ``bias`` (ReLA Table 1 row 8 per head, ``--rela-norm-scope head``)."""
        if self.groups == 1:
            return super().forward(x)
        xg = _grouped(x, self.groups)
        y = F.layer_norm(xg, (xg.size(-1),), eps=self.eps).flatten(-2)
        return y * self.weight + self.bias
