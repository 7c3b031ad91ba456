"""Fast, memory-lean ReLU attention for long sequences (ReLUFormer, Shen et al. 2023, eq. 6 and eq. 7).

Shapes: B batch, H heads, T query length, S key length, d head dimension (d_h).

ReLUFormer attention (eq. 6) is ``h_i = sum_j s_ij v_j`` with ``s_ij = ReLU(q_i . k_j) r_i``,
``q`` scaled by ``d^-1/2`` (here folded into ``r_i`` by the callers) and
``r_i = 1 / (gamma sqrt(n_i / 2))`` (``n_i`` = number of keys query ``i`` may attend to); masked positions have ``s_ij = 0``.  Its regulariser (eq. 7)
needs, per query row, ``sum_j s_ij`` and ``sum_j s_ij log s_ij`` (``0 log 0 = 0``); both can be
returned by :func:`relu_attention` and are differentiable.

Two implementations share one signature:

* :func:`relu_attention_reference` -- plain autograd ``matmul -> relu -> matmul``; keeps the
  whole ``(B, H, T, S)`` score tensor (and copies of it) alive for backward.
* the chunked kernel (:class:`_ChunkedReluAttention`, reached through :func:`relu_attention`),
  flash-attention style: query rows are processed ``chunk_size`` at a time so that one
  ``(heads, chunk, S)`` score block stays in cache; only ``q, k, v`` and the row scale are saved
  and the scores are recomputed block by block in backward.  There is no softmax, hence no
  running max and no rescaling.  Details:

  - the row scale is folded into ``q`` (``s = ReLU((r q) k^T)``, exact for any sign of ``r``),
    key-padding masks into ``k`` (zeroed keys give ``s = 0`` and zero gradients, exactly like
    masking) and query masks into ``r``: no elementwise pass over scores beyond the ReLU unless
    the mask is a general ``(.., T, S)`` one or ``causal`` (diagonal blocks only);
  - backward per block: one GEMM gives ``[s ; dO v^T]`` from stacked operands, ``relu'`` is one
    fused ``threshold_backward`` pass, ``dq`` is one GEMM and one GEMM accumulates
    ``[dV^T ; dK^T] += [dO ; r q]^T [s ; dS]`` (transposed: the big operand stays untransposed);
  - score blocks live in per-thread scratch buffers reused across calls (fresh multi-MiB
    allocations cost page faults), and ``log`` is taken of ``max(s, tiny)`` (log of exact zeros
    is ~8x slower);
  - ``causal``: key blocks after a chunk's last query are never touched (about half the work);
  - parallelism: instead of many short intra-op parallel regions (one barrier per op, which
    collapses when the CPU is shared with another job), ``torch.get_num_threads()`` Python
    threads each run single-threaded ATen ops (which release the GIL), with one join per call:
    in forward they pull (head group, chunk) blocks from one shared queue, so a thread that
    starts late (a pool thread woken from sleep, or one sharing its core with OpenMP workers
    still spin-waiting after the previous op) costs no idle time; in backward the heads (or,
    for fewer heads than threads, the query chunks) are split statically, since each head's
    dK, dV accumulate over its chunks;
  - dropout: masks are never stored.  The mask of head ``h`` and chunk ``c`` is drawn from its
    own ``torch.Generator`` seeded from ``(seed, h, c)``; ``seed`` is drawn once per call from
    the default generator (so ``torch.manual_seed`` makes a call reproducible) and backward
    regenerates exactly the same masks, independently of the thread split.
"""

import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import List, Optional, Sequence

import torch

from .masks import causal_mask as _causal_mask
from .stats import RowMassTerms

__all__ = ["relu_attention", "relu_attention_reference", "SMALL_TS", "MIN_SCORES", "BLOCK_ELEMS"]

#: Dispatch of :func:`relu_attention` (``chunk_size=None``): the chunked kernel runs only when
#: ``T * S > SMALL_TS`` (per head) *and* ``B * H * T * S >= MIN_SCORES`` (a 32 MiB float32
#: score tensor, the L3 size of the machine it was tuned on); everything smaller takes the
#: plain path.  There the plain path's score tensors stay in cache and it does 6 GEMMs to the
#: kernel's 7 (backward recomputes the scores), so it is as fast or faster; above, its memory
#: traffic dominates.  Speed of the kernel relative to the plain path (AMD EPYC, fwd+bwd,
#: d = 64, single-threaded): 4 M scores (B*H = 4, T = 1024) 1.05; 8 M: B*H = 4, 8, 32, 128
#: at T = 1448, 1024, 512, 256: 1.12, 1.22, 1.25, 1.11; 16 M (B*H = 4, T = 2048) 1.30; on
#: 2 cores B*H = 512, T = 128 gave 0.85 (hence ``SMALL_TS``).
SMALL_TS = 128 * 128
MIN_SCORES = 1 << 23
#: Target size, in score elements, of one ``(heads, chunk, S)`` block (2 MiB of float32):
#: the default chunk is ``BLOCK_ELEMS // S`` query rows (multiple of 16, at least 16).
BLOCK_ELEMS = 512 * 1024


# --------------------------------------------------------------------------------------------
# argument checking shared by both paths
# --------------------------------------------------------------------------------------------
def _check(q, k, v, row_scale, mask, dropout_p, clean=True):
    """Validate shapes/dtypes; returns the row scale as a float or a constant ``(B|1, H|1, T, 1)``
    tensor in q's dtype, non-finite values replaced by 0 (``clean=False``: validation only,
    returns None -- the Triton path cleans it in its own dtype, and each op is a launch on a GPU).

    Raises:
        ValueError: on any mismatch; the message names the expected shapes.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(x) or x.dim() != 4:
            got = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
            raise ValueError(f"{name} must be a 4-d tensor of shape (B, H, T|S, d), got {got}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, T, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError(f"expected k and v of shape (B, H, S, d) = ({B}, {H}, S, {d}) to match "
                         f"q {tuple(q.shape)}, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    S = k.shape[2]
    if not torch.is_tensor(row_scale):
        if not isinstance(row_scale, (int, float)) or isinstance(row_scale, bool):
            raise ValueError(f"row_scale must be a float or a tensor of shape (B|1, H|1, T, 1), "
                             f"got {type(row_scale).__name__}")
        row_scale = float(row_scale)
    elif (row_scale.dim() != 4 or row_scale.shape[2] != T or row_scale.shape[3] != 1
            or row_scale.shape[0] not in (1, B) or row_scale.shape[1] not in (1, H)):
        raise ValueError(f"row_scale must be a float or a tensor of shape (B|1, H|1, T, 1) = "
                         f"({B}|1, {H}|1, {T}, 1), got {tuple(row_scale.shape)}")
    elif not row_scale.is_floating_point():
        raise ValueError(f"row_scale must be floating point, got {row_scale.dtype}")
    if mask is not None:
        if not torch.is_tensor(mask) or mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor (True = blocked) broadcastable to "
                             f"(B, H, T, S) = ({B}, {H}, {T}, {S}) or None")
        # broadcastable to (B, H, T, S) without growing it: each axis 1 or the full size (plain
        # Python: torch.broadcast_shapes costs tens of µs of host time, in every layer call)
        if not (mask.dim() <= 4 and all(m in (1, t) for m, t in zip(reversed(mask.shape), (S, T, H, B)))):
            raise ValueError(f"mask of shape {tuple(mask.shape)} is not broadcastable to "
                             f"(B, H, T, S) = ({B}, {H}, {T}, {S})")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if not clean:
        return None
    # A non-finite scale (1/0 for a row with n_i = 0) counts as 0: such a row is all zeros.
    if isinstance(row_scale, float):
        return row_scale if math.isfinite(row_scale) else 0.0
    return torch.nan_to_num(row_scale.detach().to(q.dtype), nan=0.0, posinf=0.0, neginf=0.0)


# --------------------------------------------------------------------------------------------
# reference path
# --------------------------------------------------------------------------------------------
def relu_attention_reference(q, k, v, row_scale, mask=None, dropout_p=0.0, need_stats=False,
                             chunk_size=None, causal=False):
    """Plain autograd ReLU attention (ReLUFormer, Shen et al. 2023, eq. 6 and eq. 7).

    Same contract, shapes and errors as :func:`relu_attention` (``chunk_size`` is ignored);
    dropout uses :func:`torch.nn.functional.dropout`.  Memory ``O(B H T S)``.
    """
    r = _check(q, k, v, row_scale, mask, dropout_p)
    return _reference(q, k, v, r, mask, dropout_p, need_stats, causal)


def _reference(q, k, v, r, mask, dropout_p, need_stats, causal):
    """:func:`relu_attention_reference` after argument checking (``r`` from :func:`_check`)."""
    T, S = q.shape[2], k.shape[2]
    s = torch.relu(torch.matmul(q * r, k.transpose(-1, -2)))  # r folded into q: no (T, S) pass
    if causal:
        s = s.masked_fill(_causal_mask(T, S, q.device), 0.0)
    if mask is not None:
        s = s.masked_fill(mask, 0.0)
    stats = RowMassTerms.apply(s) if need_stats else None  # float32 sums for half s (no copy of s)
    if dropout_p > 0:
        s = torch.nn.functional.dropout(s, dropout_p, training=True)
    out = torch.matmul(s, v)
    return (out, stats) if need_stats else out


# --------------------------------------------------------------------------------------------
# thread split: one join per call instead of one OpenMP barrier per op
# --------------------------------------------------------------------------------------------
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()  # one parallel kernel call at a time; others run serially
_TLS = threading.local()


def _single_threaded(fn):
    """Run ``fn`` in a pool thread with single-threaded ATen ops and no autograd recording."""
    if not getattr(_TLS, "single", False):
        torch.set_num_threads(1)  # this thread's OpenMP/MKL team; global value restored by caller
        _TLS.single = True
    with torch.no_grad():
        return fn()


@contextlib.contextmanager
def _single_threaded_ops():
    """Within the block the calling thread's ATen ops use one intra-op thread (restored after)."""
    n0 = torch.get_num_threads()
    if n0 == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n0)


def _run_tasks(tasks: Sequence) -> List:
    """Run the zero-argument callables ``tasks`` concurrently, one per thread; return their results.

    Call inside :func:`_single_threaded_ops`.  The calling thread runs ``tasks[0]``, the others
    run in a persistent pool whose threads use one intra-op thread each.  Runs them one after
    the other when only one task is given or another kernel call already holds the pool.
    """
    global _POOL, _POOL_SIZE
    if len(tasks) == 1 or not _POOL_LOCK.acquire(blocking=False):
        with torch.no_grad():
            return [t() for t in tasks]
    try:
        if _POOL is None or _POOL_SIZE < len(tasks) - 1:
            if _POOL is not None:
                _POOL.shutdown(wait=True)
            _POOL_SIZE = len(tasks) - 1
            _POOL = ThreadPoolExecutor(max_workers=_POOL_SIZE, thread_name_prefix="relu_attention")
        futures = [_POOL.submit(_single_threaded, t) for t in tasks[1:]]
        try:
            with torch.no_grad():
                first = tasks[0]()
        finally:
            wait(futures)
        return [first] + [f.result() for f in futures]
    finally:
        _POOL_LOCK.release()


# --------------------------------------------------------------------------------------------
# chunked kernel
# --------------------------------------------------------------------------------------------
def _dropped(seed: int, h0: int, h1: int, idx: int, shape, p: float, device) -> torch.Tensor:
    """Bool ``(h1 - h0, c, kend)`` dropout mask (True = dropped) of heads ``h0:h1``, chunk ``idx``.

    Head ``h`` of chunk ``idx`` always gets the same mask for the same ``seed``.
    """
    u = torch.empty((h1 - h0,) + tuple(shape), device=device)
    for h in range(h0, h1):
        g = torch.Generator(device=device)
        g.manual_seed((seed * 1000003 + h * 7919 + idx * 104729 + 1) % (2**63 - 1))
        torch.rand(tuple(shape), generator=g, out=u[h - h0])
    return u < p


class _Plan:
    """Per-call geometry: flattened ``(B*H, ., d)`` operands, folded masks, chunks and tasks.

    ``q`` is pre-multiplied by the row scale, key-padding masks (``mask.shape[-2] == 1``) are
    folded into ``k`` and query masks (``mask.shape[-1] == 1``) into the row scale; only a
    general mask is applied to score blocks.
    """

    def __init__(self, q, k, v, r, mask, chunk, causal, threads):
        B, H, T, d = q.shape
        S = k.shape[2]
        self.B, self.H, self.T, self.S, self.d = B, H, T, S, d
        BH = B * H
        if mask is not None:
            while mask.dim() < 4:
                mask = mask.unsqueeze(0)
            if mask.shape[-1] == 1:  # query mask: the whole row is blocked
                r = r.masked_fill(mask, 0.0)
                mask = None
            elif mask.shape[-2] == 1:  # key padding: zero the blocked keys
                k = k.masked_fill(mask.transpose(-1, -2), 0.0)
                mask = None
        self.mask = mask  # None or a general (B|1, H|1, T, S) mask
        self.r = r.expand(B, H, T, 1).reshape(BH, T, 1)
        self.q = (q * r).reshape(BH, T, d).contiguous()  # r_i q_i
        self.k = k.expand(B, H, S, d).reshape(BH, S, d).contiguous()
        self.v = v.reshape(BH, S, d).contiguous()
        self.causal = causal
        self.chunk = chunk
        self.chunks = []  # (t0, t1, kend): rows t0:t1 see at most keys :kend
        for t0 in range(0, T, chunk):
            t1 = min(T, t0 + chunk)
            kend = min(S, max(0, t1 + S - T)) if causal else S
            self.chunks.append((t0, t1, kend))
        # tasks: (h0, h1, chunk ids); heads are split when there are enough of them, otherwise
        # chunks are dealt out by cost (longest first) so causal work stays balanced.
        threads = max(1, threads)
        live = [i for i, (t0, t1, kend) in enumerate(self.chunks) if kend > 0]
        if threads == 1 or not live:
            self.tasks = [(0, BH, live)]
        elif BH >= threads:
            bounds = [BH * i // threads for i in range(threads + 1)]
            self.tasks = [(bounds[i], bounds[i + 1], live) for i in range(threads)]
        else:
            load = [0] * threads
            ids: List[List[int]] = [[] for _ in range(threads)]
            for i in sorted(live, key=lambda i: -(self.chunks[i][1] - self.chunks[i][0]) * self.chunks[i][2]):
                w = load.index(min(load))
                ids[w].append(i)
                t0, t1, kend = self.chunks[i]
                load[w] += (t1 - t0) * kend
            self.tasks = [(0, BH, sorted(x)) for x in ids if x]
        # heads per GEMM: keep one (heads, chunk, S) block near BLOCK_ELEMS elements
        self.group = max(1, BLOCK_ELEMS // max(1, min(chunk, T) * S))

    def groups(self, h0, h1):
        return [(a, min(h1, a + self.group)) for a in range(h0, h1, self.group)]

    def finish_scores(self, s, a, b, t0, t1, kend):
        """In place on ``s = (r q) k^T`` of heads ``a:b``, rows ``t0:t1``, keys ``:kend``: ReLU, masks."""
        s.relu_()
        if self.causal:
            # inside [0, kend) only columns after the chunk's first query can be blocked
            off = self.S - self.T
            j0 = max(0, t0 + off + 1)
            if j0 < kend:
                i = torch.arange(t0, t1, device=s.device).unsqueeze(1)
                j = torch.arange(j0, kend, device=s.device).unsqueeze(0)
                s[:, :, j0:kend].masked_fill_(j > i + off, 0.0)
        if self.mask is not None:
            s.masked_fill_(self.mask_block(a, b, t0, t1, kend), 0.0)
        return s

    def mask_block(self, a, b, t0, t1, kend):
        """The general mask of flattened heads ``a:b``, rows ``t0:t1``, keys ``:kend`` (broadcastable)."""
        m = self.mask
        if m.shape[0] == 1 and m.shape[1] == 1:
            return m[0, 0, t0:t1, :kend]
        rows = [m[h // self.H if m.shape[0] > 1 else 0, h % self.H if m.shape[1] > 1 else 0, t0:t1, :kend]
                for h in range(a, b)]
        return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)


def _scratch(slot: str, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A flat buffer of at least ``numel`` elements, cached per thread and ``slot``.

    Score blocks are reused across blocks *and calls*: a fresh multi-MiB allocation per block
    or per call costs more in page faults than the ReLU itself.  Buffers larger than
    ``2 * BLOCK_ELEMS`` elements (an explicit large ``chunk_size``) are not kept, so the cache
    holds at most a few ``BLOCK_ELEMS`` per thread.
    """
    if numel > 2 * BLOCK_ELEMS:
        return torch.empty(numel, dtype=like.dtype, device=like.device)
    cache = getattr(_TLS, "scratch", None)
    if cache is None:
        cache = _TLS.scratch = {}
    key = (slot, like.dtype, like.device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf


def _view(store: torch.Tensor, *shape) -> torch.Tensor:
    """A contiguous ``shape`` view on the front of the flat scratch buffer ``store``."""
    n = 1
    for x in shape:
        n *= x
    return store[:n].view(shape)


def _forward_blocks(plan):
    """Work items ``(a, b, idx)`` of the forward pass: head groups ``a:b`` x live chunks ``idx``.

    Ordered by cost, largest first (causal chunks see different numbers of keys), so that
    threads pulling items from one shared queue finish together.
    """
    live = [i for i, (t0, t1, kend) in enumerate(plan.chunks) if kend > 0]
    items = [(a, b, idx) for a, b in plan.groups(0, plan.B * plan.H) for idx in live]
    cost = {i: (plan.chunks[i][1] - plan.chunks[i][0]) * plan.chunks[i][2] for i in live}
    items.sort(key=lambda it: -(it[1] - it[0]) * cost[it[2]])
    return items


def _forward_task(plan, queue, out, rsum, rslogs, dropout_p, seed):
    """Pull forward blocks from ``queue`` (a shared iterator of ``(a, b, idx)``) until empty.

    Every block writes its own rows of ``out`` (and of the statistics), so blocks are
    independent and dynamic scheduling (instead of a static split of heads) absorbs threads that
    start late or run slower (measured: a pool thread woken from idle starts 2-3 ms after the
    calling thread at T = 2048, which a static split turns into idle time of the other thread).
    """
    store = _scratch("s", min(plan.group, plan.B * plan.H) * min(plan.chunk, plan.T) * plan.S, plan.q)
    log_store = _scratch("log", store.numel(), plan.q) if rsum is not None else None
    for a, b, idx in queue:  # next() on a shared iterator is atomic under the GIL
        t0, t1, kend = plan.chunks[idx]
        s = torch.bmm(plan.q[a:b, t0:t1], plan.k[a:b, :kend].transpose(1, 2),
                      out=_view(store, b - a, t1 - t0, kend))
        plan.finish_scores(s, a, b, t0, t1, kend)
        if rsum is not None:
            torch.sum(s, -1, out=rsum[a:b, t0:t1])
            # s log s with 0 log 0 = 0: log(max(s, tiny)) is finite, times s = 0 is exact;
            # (log of exact zeros and xlogy take a slow path: ~8x the cost)
            logs = torch.clamp(s, min=torch.finfo(s.dtype).tiny, out=_view(log_store, *s.shape))
            torch.sum(logs.log_().mul_(s), -1, out=rslogs[a:b, t0:t1])
        o = out[a:b, t0:t1]
        if dropout_p > 0:
            s.masked_fill_(_dropped(seed, a, b, idx, s.shape[1:], dropout_p, s.device), 0.0)
            torch.bmm(s, plan.v[a:b, :kend], out=o)
            o.mul_(1.0 / (1.0 - dropout_p))
        else:
            torch.bmm(s, plan.v[a:b, :kend], out=o)


def _backward_task(plan, h0, h1, ids, g_out, g_sum, g_slogs, dq, dvk_t, exclusive, dropout_p, seed):
    """Blocks of heads ``h0:h1`` and chunks ``ids``: writes the ``dq`` rows of those chunks.

    ``dvk_t`` is ``(2, B*H, d, S)``: ``[dV^T, dK^T]``.  ``exclusive`` (no other task touches heads
    ``h0:h1``): their ``dvk_t`` entries are written here and ``[]`` is returned; otherwise returns
    ``[(a, b, (2g, d, S) partial)]`` for the caller to sum.
    """
    S, d = plan.S, plan.d
    c_max = min(plan.chunk, plan.T)
    g_max = min(plan.group, h1 - h0)
    result = []
    store = _scratch("s2", 2 * g_max * c_max * S, plan.q)  # [s; dO v^T] block
    lhs_store = _scratch("lhs", 3 * g_max * c_max * d, plan.q)
    acc_store = _scratch("acc", 2 * g_max * d * S, plan.q)
    kv_store = _scratch("kv", 2 * g_max * S * d, plan.q)
    log_store = _scratch("log", g_max * c_max * S, plan.q) if g_slogs is not None else None
    if g_slogs is None:
        g_row = g_sum
    else:
        g_row = g_slogs if g_sum is None else g_sum + g_slogs
    for a, b in plan.groups(h0, h1):
        g = b - a
        kv = torch.cat([plan.k[a:b], plan.v[a:b]], 0, out=_view(kv_store, 2 * g, S, d))
        # [dV^T; dK^T]: accumulating transposed keeps the big operand untransposed (faster GEMM)
        if exclusive and g == 1:
            acc = dvk_t[:, a].zero_()  # accumulate in place: (2, d, S), batch stride B*H*d*S
        else:
            acc = _view(acc_store, 2 * g, d, S).zero_()
        lhs = _view(lhs_store, 3 * g, c_max, d)  # [r q; dO; r q] of one chunk
        for idx in ids:
            t0, t1, kend = plan.chunks[idx]
            L = lhs[:, : t1 - t0]
            L[:g].copy_(plan.q[a:b, t0:t1])
            L[g:2 * g].copy_(g_out[a:b, t0:t1])
            L[2 * g:].copy_(plan.q[a:b, t0:t1])
            buf = torch.bmm(L[:2 * g], kv[:, :kend].transpose(1, 2),
                            out=_view(store, 2 * g, t1 - t0, kend))  # [s; dO v^T]
            s, gp = buf[:g], buf[g:]
            plan.finish_scores(s, a, b, t0, t1, kend)
            dropped = (_dropped(seed, a, b, idx, s.shape[1:], dropout_p, s.device)
                       if dropout_p > 0 else None)
            if dropped is not None:
                gp.masked_fill_(dropped, 0.0)  # the 1/(1-p) factor is folded into dO
            if g_row is not None:  # g_sum + g_slogs, the row-constant part of the stats' gradient
                gp.add_(g_row[a:b, t0:t1])
            if g_slogs is not None:
                # d(s log s)/ds = log s + 1 on s > 0; log(max(s, tiny)) stays finite and fast,
                # entries with s == 0 are zeroed just below
                logs = torch.clamp(s, min=torch.finfo(s.dtype).tiny, out=_view(log_store, *s.shape))
                gp.addcmul_(logs.log_(), g_slogs[a:b, t0:t1])
            # relu' (and every mask, where s == 0): keep the gradient only where s > 0
            torch.ops.aten.threshold_backward.grad_input(gp, s, 0.0, grad_input=gp)
            torch.bmm(gp, plan.k[a:b, :kend], out=dq[a:b, t0:t1])
            if dropped is not None:
                s.masked_fill_(dropped, 0.0)
            acc[:, :, :kend].baddbmm_(L[g:].transpose(1, 2), buf)  # [dV; dK]^T += [dO; r q]^T [s; dS]
        if exclusive:
            if g > 1:
                dvk_t[:, a:b].copy_(acc.view(2, g, d, S))
        else:
            result.append((a, b, acc.clone()))
    return result


class _ChunkedReluAttention(torch.autograd.Function):
    """Autograd function of the chunked kernel; saves ``q, k, v, r, mask`` and the dropout seed."""

    @staticmethod
    def forward(ctx, q, k, v, r, mask, dropout_p, need_stats, chunk, causal, seed, threads):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, r, mask)
        ctx.args = (dropout_p, chunk, causal, seed, threads)
        with _single_threaded_ops():
            return _ChunkedReluAttention._forward(q, k, v, r, mask, dropout_p, need_stats, chunk,
                                                  causal, seed, threads)

    @staticmethod
    def _forward(q, k, v, r, mask, dropout_p, need_stats, chunk, causal, seed, threads):
        plan = _Plan(q, k, v, r, mask, chunk, causal, threads)
        B, H, T, d = q.shape
        BH = B * H
        # outputs: every row of a live chunk is written by a task, rows of dead chunks are zeroed
        out = q.new_empty(BH, T, d)
        # (float32/float64 only here, so the row sums are at least float32, as the plain path's)
        rsum = q.new_empty(BH, T) if need_stats else None
        rslogs = q.new_empty(BH, T) if need_stats else None
        for t0, t1, kend in plan.chunks:
            if kend == 0:
                for x in (out, rsum, rslogs):
                    if x is not None:
                        x[:, t0:t1].zero_()
        queue = iter(_forward_blocks(plan))
        _run_tasks([
            (lambda: _forward_task(plan, queue, out, rsum, rslogs, dropout_p, seed))
            for _ in plan.tasks  # one worker per thread the plan uses
        ])
        out = out.view(B, H, T, d)
        if need_stats:
            return out, rsum.view(B, H, T), rslogs.view(B, H, T)
        return out

    @staticmethod
    def backward(ctx, g_out, g_sum=None, g_slogs=None):
        q, k, v, r, mask = ctx.saved_tensors
        with _single_threaded_ops():
            return _ChunkedReluAttention._backward(q, k, v, r, mask, g_out, g_sum, g_slogs, *ctx.args)

    @staticmethod
    def _backward(q, k, v, r, mask, g_out, g_sum, g_slogs, dropout_p, chunk, causal, seed, threads):
        plan = _Plan(q, k, v, r, mask, chunk, causal, threads)
        B, H, T, d = q.shape
        S, BH = k.shape[2], B * H
        if g_out is None:
            g_out = q.new_zeros(BH, T, d)
        else:
            g_out = g_out.reshape(BH, T, d)
            if dropout_p > 0:
                g_out = g_out * (1.0 / (1.0 - dropout_p))
            g_out = g_out.contiguous()
        g_sum = None if g_sum is None else g_sum.reshape(BH, T, 1).contiguous()
        g_slogs = None if g_slogs is None else g_slogs.reshape(BH, T, 1).contiguous()
        exclusive = all(ids == plan.tasks[0][2] for _, _, ids in plan.tasks)  # split by heads
        # every row of dq in a live chunk is written by a task (dead chunks zeroed here); with
        # exclusive tasks every row of dk, dv is written too, otherwise partials are summed in
        dq = q.new_empty(BH, T, d)
        for t0, t1, kend in plan.chunks:
            if kend == 0:
                dq[:, t0:t1].zero_()
        # [dV^T, dK^T]: the transposed accumulators keep the big GEMM operand untransposed
        dvk_t = (q.new_empty if exclusive and plan.tasks[0][2] else q.new_zeros)(2, BH, d, S)
        parts = _run_tasks([
            (lambda h0=h0, h1=h1, ids=ids: _backward_task(
                plan, h0, h1, ids, g_out, g_sum, g_slogs, dq, dvk_t, exclusive, dropout_p, seed))
            for h0, h1, ids in plan.tasks
        ])
        for part in parts:
            for a, b, acc in part:
                dvk_t[:, a:b] += acc.view(2, b - a, d, S)
        # q' = r q  ->  dq = r dq' (dk came out right: key-padded columns of dS are zero)
        dq = (dq * plan.r).view(B, H, T, d)
        dv = dvk_t[0].view(B, H, d, S).transpose(-1, -2).contiguous()
        dk = dvk_t[1].view(B, H, d, S).transpose(-1, -2).contiguous()
        return dq, dk, dv, None, None, None, None, None, None, None, None


def _default_chunk(S: int) -> int:
    return max(16, (BLOCK_ELEMS // max(S, 1)) // 16 * 16)


def relu_attention(q, k, v, row_scale, mask=None, dropout_p=0.0, need_stats=False,
                   chunk_size=None, causal=False):
    """ReLU attention of ReLUFormer (Shen et al. 2023), eq. 6, with the row statistics of eq. 7.

    ``s_ij = ReLU(q_i . k_j) r_i`` (``0`` where masked), ``out_i = sum_j dropout(s_ij) v_j``.

    Args:
        q: ``(B, H, T, d)`` queries (any scale, e.g. ``d^-1/2``, may be folded into ``row_scale``);
            float32 or float64 for the chunked kernel (other float dtypes always take the plain path).
        k, v: ``(B, H, S, d)`` keys and values, same dtype as ``q``.
        row_scale: the per-query factor ``r_i`` (e.g. ``1 / (gamma sqrt(n_i / 2))``, unitless):
            a Python float or a float tensor of shape ``(B|1, H|1, T, 1)``; a constant (no
            gradient).  Non-finite entries (``1/0`` for a row with ``n_i = 0``) count as 0.
        mask: bool, broadcastable to ``(B, H, T, S)``, ``True`` = blocked (``s = 0`` there), or
            None.  Key-padding ``(B|1, H|1, 1, S)`` and query ``(B|1, H|1, T, 1)`` masks are
            free in the chunked kernel; a general mask costs one pass per score block.
        dropout_p: attention dropout on ``s`` (after the statistics, before ``@ v``), in
            ``[0, 1)``; the chunked kernel regenerates the same mask in backward.  Pass 0 at
            inference.
        need_stats: also return ``(row_sum, row_slogs)``, each ``(B, H, T)``:
            ``sum_j s_ij`` and ``sum_j s_ij log s_ij`` (``0 log 0 = 0``), both differentiable;
            accumulated and returned in at least float32 (float16/bfloat16 inputs: float32
            sums, as the Triton kernel's; float32/float64: the inputs' dtype).
        chunk_size: query rows per block of the chunked kernel; giving it forces the chunked
            kernel (float32/float64).  ``None``: dispatch below, ``BLOCK_ELEMS // S`` rows.
        causal: additionally block keys ``j > i + (S - T)``; the chunked kernel skips the key
            blocks after each chunk's last query.

    Returns:
        ``out`` ``(B, H, T, d)``, or ``(out, (row_sum, row_slogs))`` when ``need_stats``; all
        differentiable w.r.t. ``q, k, v``.  Fully masked rows and rows without a positive score
        give exact zeros (never NaN), in the output, the statistics and the gradients.

    Dispatch (``chunk_size=None``): the chunked kernel runs when ``T * S > SMALL_TS``
    (``128 * 128``, per head) and ``B * H * T * S >= MIN_SCORES`` (``2**23``; half that with
    ``need_stats``, whose plain-path cost is higher: 1.05-1.19x at 4 M scores) and the dtype is
    float32/float64; otherwise :func:`relu_attention_reference` (plain ``matmul -> relu ->
    matmul``, faster at sentence lengths and for small score tensors).  The chunked kernel
    keeps ``O(threads * BLOCK_ELEMS)`` scratch instead of ``O(B H T S)`` saved scores.

    Raises:
        ValueError: q not ``(B, H, T, d)`` or k, v not ``(B, H, S, d)`` (naming the expected
            shapes); dtypes differ or are not floating point; ``row_scale`` neither a float nor
            ``(B|1, H|1, T, 1)``; ``mask`` not bool or not broadcastable to ``(B, H, T, S)``;
            ``dropout_p`` outside ``[0, 1)``; ``chunk_size`` not a positive int; ``chunk_size``
            given with a dtype other than float32/float64.
    """
    r = _check(q, k, v, row_scale, mask, dropout_p)
    T, S = q.shape[2], k.shape[2]
    fast_dtype = q.dtype in (torch.float32, torch.float64)
    if chunk_size is None:
        min_scores = MIN_SCORES // 2 if need_stats else MIN_SCORES
        if T * S <= SMALL_TS or q.shape[0] * q.shape[1] * T * S < min_scores or not fast_dtype:
            return _reference(q, k, v, r, mask, dropout_p, need_stats, causal)
        chunk_size = _default_chunk(S)
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    elif not fast_dtype:
        raise ValueError(f"the chunked kernel needs float32 or float64, got {q.dtype}")
    if not torch.is_tensor(r):
        r = torch.full((1, 1, T, 1), r, dtype=q.dtype, device=q.device)
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    threads = torch.get_num_threads() if q.device.type == "cpu" else 1
    res = _ChunkedReluAttention.apply(q, k, v, r, mask, float(dropout_p), bool(need_stats),
                                      int(chunk_size), bool(causal), seed, threads)
    if need_stats:
        out, rsum, rslogs = res
        return out, (rsum, rslogs)
    return res
