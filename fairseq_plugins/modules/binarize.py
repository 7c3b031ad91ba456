"""Binarisation and masked-selection projections of E-ATT (Attention with Energy-Friendly Operations).

Shape legend: N tokens (any leading dims flattened), d input dimension (model size), k output
dimension of ``W_Q`` / ``W_K`` (``k = d`` here: fairseq's ``q_proj`` / ``k_proj``).  Weights use
``nn.Linear``'s layout ``(k, d)``; the paper writes ``W in R^{d x k}``, so the paper's *row* ``i``
of ``W_Q`` is our column ``weight[:, i]``.

* :func:`binarize` -- eq. 7, ``f(x) = 1[x > tau]``, with the surrogate gradient of eq. 8
  ``df/dx ~ sqrt(2/pi) exp(-2 (x - tau)^2)`` (the density of ``N(tau, 1/4)``: it integrates to 1,
  so it is the derivative of a smoothed step).  Eq. 8 as printed writes the back-propagated
  gradient ``Z`` inside the exponent; we read it, as the official code (NLP2CT/E-Att,
  ``SNNActivateFunction_Normal``) and Wu et al. (2018) do, as ``grad_in = grad_out * g(x)``.
  The official code centres the bump at 0 whatever the threshold; here it is centred at ``tau``
  as eq. 8 says (identical for ``tau = 0``).
* :func:`select_add` -- eqs. 9-12 literally: each 1 in the binary input selects one row of
  ``W`` and the selected rows are *added* (``index_add``); no multiplication in the forward pass.
  The reference for tests and the basis of the exact operation count :func:`select_add_count`.
* :func:`select_matmul` -- the fast equivalent, ``F.linear`` on the 0/1 input (what the model
  runs; on {0, 1} inputs the products are the selections).
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["binarize", "surrogate_grad", "select_add", "select_add_count", "select_matmul"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def surrogate_grad(x: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 8: ``sqrt(2/pi) * exp(-2 (x - tau)^2)``, elementwise, same shape as ``x``."""
    return _SQRT_2_OVER_PI * torch.exp(-2.0 * (x - tau) ** 2)


class _Binarize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tau):
        ctx.save_for_backward(x)
        ctx.tau = tau
        return (x > tau).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * surrogate_grad(x, ctx.tau).to(grad_out.dtype), None


def binarize(x: torch.Tensor, tau: float) -> torch.Tensor:
    """E-ATT eq. 7 with the surrogate gradient of eq. 8.

    Args:
        x: any shape, floating point.
        tau: threshold (float).

    Returns:
        Tensor of ``x``'s shape and dtype holding exact 0.0 / 1.0; ``x > tau`` is 1.
    """
    return _Binarize.apply(x, float(tau))


class _SelectAdd(torch.autograd.Function):
    """Forward: additions only (index_add of selected weight rows).  Backward: the gradients
    of the linear map ``x W^T + b`` it equals on binary inputs (for ``x``, ``W`` and ``b``)."""

    @staticmethod
    def forward(ctx, x_bin, weight, bias):
        d = x_bin.size(-1)
        flat = x_bin.reshape(-1, d)  # (N, d)
        n = flat.size(0)
        rows = weight.t()  # (d, k): the paper's rows of W
        if bias is None:
            out = weight.new_zeros(n, weight.size(0))
        else:
            out = bias.detach().expand(n, weight.size(0)).clone()
        tok, feat = (flat != 0).nonzero(as_tuple=True)  # the selections g(X~, W~) of eq. 12
        out.index_add_(0, tok, rows.index_select(0, feat))  # eq. 11: sum of the selected rows
        ctx.save_for_backward(x_bin, weight)
        ctx.has_bias = bias is not None
        return out.view(*x_bin.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad_out):
        x_bin, weight = ctx.saved_tensors
        g = grad_out.reshape(-1, weight.size(0))  # (N, k)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.matmul(grad_out, weight)  # (..., d)
        if ctx.needs_input_grad[1]:
            gw = g.t().matmul(x_bin.reshape(-1, x_bin.size(-1)).to(g.dtype))  # (k, d)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        return gx, gw, gb


def select_add(x_bin: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Masked-selection projection by additions only (E-ATT eqs. 9-12).

    ``out[n] = b + sum_{i : x_bin[n, i] = 1} W[:, i]``.

    Args:
        x_bin: ``(..., d)`` holding only 0 and 1 (e.g. from :func:`binarize`).
        weight: ``(k, d)`` (``nn.Linear`` layout).  bias: ``(k,)`` or None.

    Returns:
        ``(..., k)``; equal to :func:`select_matmul` (up to summation order).

    Raises:
        ValueError: ``x_bin`` holds a value other than 0 and 1, or the dimensions differ.
    """
    if x_bin.size(-1) != weight.size(1):
        raise ValueError(f"input dimension {x_bin.size(-1)} != weight's {weight.size(1)}")
    if not bool(((x_bin == 0) | (x_bin == 1)).all()):
        raise ValueError("select_add needs a binary (0/1) input; binarize it first")
    return _SelectAdd.apply(x_bin, weight, bias)


def select_add_count(x_bin: torch.Tensor, k: int, bias: bool = True) -> int:
    """Additions :func:`select_add` performs on ``x_bin`` ``(..., d)`` for ``k`` outputs.

    With a bias every selected row is one ``k``-vector addition onto the running sum
    (``nnz * k``); without, the first selected row of a token is a copy
    (``(nnz - tokens with any 1) * k``).  No multiplications.
    """
    flat = x_bin.reshape(-1, x_bin.size(-1)) != 0
    nnz = int(flat.sum())
    if bias:
        return nnz * k
    return (nnz - int(flat.any(-1).sum())) * k


def select_matmul(x_bin: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The fast equivalent of :func:`select_add`: ``F.linear(x_bin, weight, bias)``, ``(..., d) -> (..., k)``."""
    return F.linear(x_bin, weight, bias)
