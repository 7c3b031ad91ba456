"""The GPU benchmark's harness (mt_pipeline.bench_gpu) on CPU: its steps run, its parsing and
its ratios are right, and without CUDA it stops with a clear message.  No timing is asserted."""

import re

import pytest
import torch

from mt_pipeline import bench_gpu


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_exits_2_with_a_message(capsys, tmp_path):
    out = tmp_path / "r.md"
    assert bench_gpu.main(["--sections", "core", "--out", str(out)]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not out.exists()


def test_bad_options_name_the_choices(capsys):
    with pytest.raises(SystemExit):
        bench_gpu.main(["--sections", "core,fast"])
    assert "valid sections: core, layer, decode, train" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_gpu.main(["--sections", "train"])
    assert "--train-data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_gpu.main(["--layer-kinds", "enc,decoder"])
    assert "unknown layer kinds ['decoder']; valid: enc, dec, cross" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_gpu.main(["--core-cases", "relu_triton,eatt"])
    assert "unknown core cases ['eatt']; valid: sdpa flash," in capsys.readouterr().err
    for bad in ("0,1.5", "0.1,x", ""):
        with pytest.raises(SystemExit):
            bench_gpu.main(["--attention-dropout", bad])
        assert "a comma list of rates in [0, 1)" in capsys.readouterr().err


def test_steps_run_on_cpu_with_the_torch_backend(monkeypatch):
    """Every kind of step of the harness does its forward (+ backward) on a tiny CPU case: the
    loss (core, layer) and the layer outputs are finite, and the one ``torch.autograd.grad`` call
    of a step returns finite gradients of every differentiated tensor, all non-zero (inputs q, k,
    v / x, y and every parameter) but the key bias of softmax layers, which a softmax over keys
    cannot see (adding ``q . b_k`` to every key's score of a query): only rounding remains there.
    A decode step runs without autograd and gives finite outputs, the same ones twice."""
    from fairseq.modules import MultiheadAttention

    calls, outs = [], []
    grad = torch.autograd.grad

    def spy(outputs, inputs, *a, **kw):
        res = grad(outputs, inputs, *a, **kw)
        calls.append((outputs.detach(), list(inputs), res))
        return res

    monkeypatch.setattr(torch.autograd, "grad", spy)

    def ran(run):
        calls.clear()
        outs.clear()
        run()
        return list(calls), list(outs)

    def check_grads(label, calls, names):
        (loss, inputs, grads), = calls  # one backward per step
        assert loss.dim() == 0 and torch.isfinite(loss), label
        assert len(grads) == len(inputs) == len(names), label
        for n, x, g in zip(names, inputs, grads):
            assert g.shape == x.shape and torch.isfinite(g).all(), (label, n)
            if n == "k_proj.bias" and label in ("stock", "softmax"):
                assert g.abs().max() < 1e-5, (label, n)  # shift invariance of the softmax
            else:
                assert g.abs().max() > 1e-3, (label, n)

    def record(m, _inp, out):
        if isinstance(m, MultiheadAttention):
            outs.append((m, out[0].detach()))

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        cases = bench_gpu.core_cases(8, torch.float32, "cpu", rows=64, heads=2, head_dim=16, with_triton=False,
                                     with_flex=False)
        assert set(cases) == {"sdpa (default)", "relu torch", "reluformer+eq.7 torch", "eatt torch"}
        every = bench_gpu.core_cases(8, torch.float32, "cpu", rows=64, heads=2, head_dim=16)  # built, not run
        assert set(every) - set(bench_gpu.CORE_CASES) == set()  # --core-cases can select every label
        for label, run in cases.items():
            c, _ = ran(run)
            check_grads(label, c, ("q", "k", "v"))
        for kind in bench_gpu.LAYER_KINDS:
            layer = bench_gpu.layer_cases(8, torch.float32, "cpu", tokens=24, C=16, H=2, dropout=0.1, kind=kind,
                                          names=["softmax", "rela_g", "reluformer", "eatt"], backends=("torch",))
            assert set(layer) == {"stock", "softmax", "rela_g torch", "reluformer torch", "eatt torch"}
            for label, run in layer.items():
                c, o = ran(run)
                (m, out), = o
                assert out.shape == (8, 3, 16) and torch.isfinite(out).all(), (kind, label)
                params = [n for n, p in m.named_parameters() if p.requires_grad]
                check_grads(label, c, (["x", "y"] if kind == "cross" else ["x"]) + params)
        with pytest.raises(ValueError, match="valid: enc, dec, cross"):
            bench_gpu.layer_cases(8, torch.float32, "cpu", kind="self")
        dec = bench_gpu.decode_cases(5, torch.float32, "cpu", sentences=2, beam=2, C=16, H=2,
                                     names=("rela_g", "eatt"), backends=("torch",))
        for label, run in dec.items():
            c, o = ran(run)
            (_, out), = o
            assert c == [] and not out.requires_grad, label
            assert out.shape == (1, 4, 16) and torch.isfinite(out).all() and out.abs().max() > 0, label
            _, o2 = ran(run)  # the cache stays S - 1 long: a second step sees the same state
            assert torch.equal(o2[0][1], out), label
    finally:
        hook.remove()


def test_layer_kinds_pass_the_masks_fairseq_passes(monkeypatch):
    """enc: key padding only; dec: fairseq's float future mask + key padding; cross: other keys."""
    from fairseq_plugins.attention import FunctionalMultiheadAttention

    seen = []
    forward = FunctionalMultiheadAttention.forward

    def spy(self, query, key, value, key_padding_mask=None, attn_mask=None, **kw):
        seen.append((key is query, key_padding_mask, attn_mask))
        return forward(self, query, key, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(FunctionalMultiheadAttention, "forward", spy)
    for kind in ("enc", "dec", "cross"):
        seen.clear()
        bench_gpu.layer_cases(70, torch.float32, "cpu", tokens=700, C=16, H=2, names=["rela_g"],
                              backends=("torch",), kind=kind)["rela_g torch"]()
        (same, pad, future), = seen
        assert same == (kind != "cross")
        # 10 sentences of T 70: lengths 70 - (b mod 8) * 2, the first unpadded
        assert pad.shape == (10, 70) and not pad[0].any() and pad[1:8].any(1).all()
        assert (~pad).sum(1).tolist() == [70, 68, 66, 64, 62, 60, 58, 56, 70, 68]
        if kind == "dec":
            assert future.dtype == torch.float32 and torch.equal(
                torch.isneginf(future), torch.ones(70, 70, dtype=torch.bool).triu(1))
        else:
            assert future is None


def test_relu_flex_is_relu_attention_with_null_rows_zero():
    """FlexAttention with score_mod log relu(s) times exp(lse) is ReLU attention (forward; its
    backward needs CUDA), including a query without any positive score."""
    from fairseq_plugins.attention import kernels

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(3))
    q[0, 1, 3] = 0.0  # a null row: every score 0
    out = bench_gpu.relu_flex(q, k, v, 0.25)
    ref = kernels.relu_attention_reference(q * 0.25, k, v, 1.0)
    assert not torch.isnan(out).any() and torch.equal(out[0, 1, 3], torch.zeros(16))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_parse_wps_takes_the_median_after_the_first_interval():
    log = "\n".join([
        '2026-01-01 00:00:01 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "9", "wps": "100"}',
        '2026-01-01 00:00:02 | INFO | train_inner | {"epoch": 1, "update": 0.2, "loss": "8", "wps": "2000"}',
        "some other line",
        '2026-01-01 00:00:03 | INFO | train_inner | {"epoch": 1, "update": 0.3, "loss": "7", "wps": "3000"}',
        '2026-01-01 00:00:04 | INFO | train_inner | {"epoch": 1, "update": 0.4, "loss": "7", "wps": "2500"}',
        '2026-01-01 00:00:05 | INFO | train | {"epoch": 1, "train_loss": "7", "train_wps": "9"}',
    ])
    assert bench_gpu.parse_wps(log) == 2500.0
    assert bench_gpu.parse_wps("nothing logged") is None


def test_render_reports_ratios_against_the_baseline_of_the_same_run():
    res = {"layer": {"bf16": {256: {"stock": {"ms": 2.0, "kernel_ms": 1.5, "mib": 100.0},
                                    "rela_g triton": {"ms": 1.0, "kernel_ms": 0.5, "mib": 120.0},
                                    "relu triton": {"ms": 4.0, "kernel_ms": 0.5, "host_ms": 3.5, "syncs": 2,
                                                    "mib": 90.0},
                                    "eatt torch": {"error": "OOM"}}}},
           "train": {"stock transformer": {"wps": 1000.0, "wall_s": 10, "command": "fairseq-train x"},
                     "rela_g auto": {"wps": 900.0, "wall_s": 11, "command": "fairseq-train y"}}}
    meta = {"gpu": "Test GPU", "tokens": 16384, "core_rows": 2**20,
            "provenance": {"command": "mt-bench-gpu", "git_commit": "abc"}}
    md = bench_gpu.render(res, meta)
    assert "| rela_g triton | 1 ms (2.00x); kernels 0.5 ms (3.00x), 120 MiB |" in md
    assert "| stock | 2 ms; kernels 1.5 ms, 100 MiB |" in md
    assert "| eatt torch | OOM |" in md
    assert "| relu triton | 4 ms (0.50x); kernels 0.5 ms (3.00x); host 3.5 ms, 2 syncs, 90 MiB |" in md
    assert "| rela_g auto | 900 | 0.90x | 11 |" in md
    assert "regime: benchmark" in md and "## Provenance" in md
    assert bench_gpu.REGIME_LINE in md and "neither smoke, converged nor paper scale" in md
    assert "Incomplete" not in md  # complete unless the run says otherwise
    assert "**Incomplete: the run stopped" in bench_gpu.render(res, dict(meta, complete=False))


def test_host_ms_is_the_time_to_issue_a_step():
    """host_ms times the calls themselves (on CPU: their whole work): a step that costs at least
    2 ms of CPU time cannot be reported below 2 ms."""
    import time

    def run():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass

    assert bench_gpu.host_ms(run, steps=5) >= 2.0


def test_host_profile_names_the_ops_and_python_functions_of_a_step():
    """The host profile of a step shows its aten ops (torch.profiler) and its own Python functions
    (cProfile), so a host-bound layer row can be traced to what issues it."""

    def issue_many_small_ops():
        x = torch.ones(4)
        for _ in range(50):
            x = torch.mm(x[None], torch.eye(4))[0]
        return x

    text = bench_gpu.host_profile(issue_many_small_ops, steps=3, top=10)
    ops, python = text.split("cProfile:")
    assert "aten::mm" in ops and "aten::eye" in ops
    assert "issue_many_small_ops" in python and "ms of Python per call" in python


def test_op_counts_count_kernels_of_forward_and_backward_not_views():
    """op_counts sees the ops of autograd's backward too (each a kernel launch on a GPU) and leaves
    out views and allocations, which launch nothing."""
    w = torch.randn(4, 3, requires_grad=True)

    def run():
        y = (w * 2.0).t().reshape(12).view(3, 4)  # mul, a copy (reshape of a transpose) + views
        buf = torch.empty(3)  # allocation
        torch.autograd.grad(y.sum() + buf.zero_().sum(), [w])  # sum, zero_, sum, add + backward

    counts = bench_gpu.op_counts(run)
    assert counts.get("mul", 0) >= 2  # forward w * 2 and its backward (grad * 2)
    assert counts.get("sum") == 2 and counts.get("zero_") == 1 and counts.get("clone") == 1
    assert not {"t", "view", "reshape", "_unsafe_view", "expand", "empty", "detach"} & set(counts)


def test_op_counts_report_runs_on_cpu_and_names_its_regime(tmp_path):
    """``--op-counts`` needs no GPU: one table per layer kind and rate, ratios against stock,
    provenance, nothing written on a bad function name."""
    out = tmp_path / "ops.md"
    assert bench_gpu.main(["--op-counts", str(out), "--functions", "relu", "--layer-kinds", "enc",
                           "--attention-dropout", "0"]) == 0
    text = out.read_text()
    assert "**Regime: benchmark**" in text and "## encoder self-attention (key padding), dropout 0" in text
    stock = re.search(r"\| stock \| (\d+) \| 1.00x \|", text)
    relu = re.search(r"\| relu torch \| (\d+) \| (\d+\.\d+)x \|", text)
    assert stock and relu and abs(int(relu.group(1)) / int(stock.group(1)) - float(relu.group(2))) < 0.01
    assert "git commit" in text
    bad = tmp_path / "bad.md"
    with pytest.raises(KeyError, match="registered"):
        bench_gpu.main(["--op-counts", str(bad), "--functions", "nope", "--layer-kinds", "enc"])
    assert not bad.exists()


def test_sync_count_counts_syncs_not_the_debug_modes_own_warning():
    """torch warns once per process when the sync debug mode is first set; that is no sync (it made
    the first layer of each pytest worker look synchronising on the H200 of 2026-11-26)."""
    proto = ("Synchronization debug mode is a prototype feature and does not yet detect all "
             "synchronizing operations (Triggered internally at Module.cpp:1003.)")
    sync = "called a synchronizing CUDA operation (Triggered internally at CUDAFunctions.cpp:162.)"
    assert bench_gpu.count_sync_warnings([proto]) == 0
    assert bench_gpu.count_sync_warnings([proto, sync, "other", sync]) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sync_count_sees_item_and_nothing_else():
    x = torch.randn(64, device="cuda")
    assert bench_gpu.sync_count(lambda: x.sum().item()) >= 1
    assert bench_gpu.sync_count(lambda: (x * 2).sum()) == 0


def test_module_runs_as_a_script():
    """docs/gpu.md starts it as ``python3 -m mt_pipeline.bench_gpu`` in a GPU window: the module must
    call main() (it once did nothing and exited 0); here it exits 2 with its no-CUDA message."""
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("checks the message of a machine without CUDA")
    r = subprocess.run([sys.executable, "-m", "mt_pipeline.bench_gpu", "--T", "64"], capture_output=True, text=True)
    assert r.returncode == 2 and "no CUDA device" in r.stderr
