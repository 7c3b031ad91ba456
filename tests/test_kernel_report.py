"""``mt-kernel-report`` (:mod:`mt_pipeline.kernel_report`): the PTX/ptxas readers on known text,
the recorded launches, and the targets of issue 28 on the main configurations -- the kernels
compiled for sm_90a (H100) without a GPU, as the JIT specialises them: no spills, no serialized
wgmma.  The compile tests skip with a reason when triton or its NVIDIA backend is missing."""

import pytest
import torch

import fairseq_plugins.attention.triton as tk
from mt_pipeline import kernel_report as kr

needs_nvidia = pytest.mark.skipif(not tk.triton_available(), reason="triton is not installed (pip install -e .[gpu])")

PTX = """
.visible .entry k(
)
{
// %bb.0:
\tmov.b32 \t%r1, 0;
\t@%p1 bra \t$L__BB0_4;
$L__BB0_1:                              // =>This Loop Header: Depth=1
                                        //     Child Loop BB0_2 Depth 2
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, 0, 1, 1, 0, 1;
\tadd.s32 \t%r2, %r2, 1;
$L__BB0_2:                              //   Parent Loop BB0_1 Depth=1
                                        // =>  This Inner Loop Header: Depth=2
\tsub.f32 \t%f1, %f2, %f3;
\tabs.f32 \t%f1, %f1;
\t@%p2 bra \t$L__BB0_2;
// %bb.3:                               //   in Loop: Header=BB0_1 Depth=1
\t.loc\t1 2 3
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, 0, 1, 1, 0, 1;
\t@%p3 bra \t$L__BB0_1;
$L__BB0_4:
\tret;
}
"""


def test_analyse_ptx_finds_the_main_loop_and_counts_nested_loops_per_trip():
    a = kr.analyse_ptx(PTX, inner_trips=10)
    assert a["instructions"] == 10 and a["wgmma"] == 2 and a["mma"] == 0
    # main loop: BB0_1, BB0_2 (nested: 3 instructions), bb.3 -> 7 instructions, both wgmma
    assert a["loop_instructions"] == 7 and a["loop_wgmma"] == 2 and a["inner_loops"] == [3]
    assert a["loop_dynamic"] == 7 + 3 * 9
    assert kr.analyse_ptx("\tret;\n")["loop_instructions"] == 0
    # one trip count per nested loop (E-ATT: d / CHUNK chunk steps, then d / CHUNK sign-sum steps)
    assert kr.analyse_ptx(PTX, inner_trips=[4, 10])["loop_dynamic"] == 7 + 3 * 3
    assert kr._inner_trips("l1_bwd_q", {"BLOCK_D": 64, "CHUNK": 2}, 64) == [32, 32]
    assert kr._inner_trips("rect_fwd", {"BLOCK_D": 64}, 64) == 1


SASS = """
	.target	sm_90a
        .global         k
k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/               @P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0030*/                   LOP3.LUT R2, R3, R4, R5, 0x96, !PT ;
.L_x_2:
        /*0040*/                   FADD R6, R7, -R8 ;
        /*0050*/              @!P2 BRA `(.L_x_2) ;
        /*0060*/                   IMAD.WIDE.U32 R10, R11, 0x3, RZ ;
        /*0070*/                   NOP ;
        /*0080*/               @P3 BRA `(.L_x_1) ;
.L_x_0:
        /*0090*/                   EXIT ;
.L_x_3:
        /*00a0*/                   BRA `(.L_x_3);
"""


def test_analyse_sass_finds_the_main_loop_in_the_machine_code():
    """Backward branches are loops; the main loop (with the HGMMA) counts its nested loop x its
    trips; NOP padding, code outside the loop and the trailing self-branch are not counted."""
    a = kr.analyse_sass(SASS, inner_trips=10)
    # .L_x_1 .. the BRA to it: HGMMA, LOP3, (FADD, BRA) x 10, IMAD, BRA (NOP dropped)
    assert a["sass_loops_nested"] == 1
    assert a["sass_opcodes"] == {"HGMMA": 1, "LOP3": 1, "FADD": 10, "BRA": 11, "IMAD": 1}
    assert a["sass_loop"] == 24
    assert kr.analyse_sass("")["sass_loop"] == 0


def test_one_pass_kernels_count_the_whole_kernel():
    """``whole`` (the row terms: one pass per program, no loop): every PTX instruction once, and in
    SASS every instruction but NOP padding and the trailing self-branch (never reached; without
    ``whole`` it is the only backward branch of a loop-free kernel, taken for its "loop")."""
    a = kr.analyse_ptx(PTX, inner_trips=10, whole=True)
    assert a["loop_instructions"] == a["loop_dynamic"] == a["instructions"] == 10
    assert a["loop_wgmma"] == 2 and a["inner_loops"] == [] and sum(a["loop_opcodes"].values()) == 10
    assert a["loop_opcodes"]["mov"] == 1 and a["loop_opcodes"]["ret"] == 1
    b = kr.analyse_sass(SASS, inner_trips=10, whole=True)
    assert b["sass_loops_nested"] == 0
    assert b["sass_opcodes"] == {"LDC": 1, "BRA": 3, "HGMMA": 1, "LOP3": 1, "FADD": 1, "IMAD": 1, "EXIT": 1}
    assert b["sass_loop"] == 9  # the trap BRA and the NOP left out
    flat = "\n".join(line for line in SASS.splitlines() if "BRA `(.L_x_1)" not in line and "BRA `(.L_x_2)" not in line)
    assert kr.analyse_sass(flat)["sass_opcodes"] == {"BRA": 1}  # the trap, without whole
    assert kr.analyse_ptx("\tret;\n", whole=True)["loop_dynamic"] == 1 and kr.analyse_sass("", whole=True)["sass_loop"] == 0


def test_loop_opcodes_count_the_main_loop_per_iteration():
    """The opcode histogram of the main loop: guard predicates and type suffixes dropped, the
    nested loop's opcodes x its trips, nothing outside the loop (mov, ret); it sums to loop_dynamic."""
    assert kr._opcode("@%p1 mul.hi.u32 \t%r1, %r2, -766435501;") == "mul.hi"
    assert kr._opcode("@!%p7 ld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r5];") == "ld.shared"
    assert kr._opcode("selp.b32 %r1, 1, 0, %p1;") == "selp"
    assert kr._opcode("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, %rd1;") == "wgmma.mma_async"
    a = kr.analyse_ptx(PTX, inner_trips=10)
    assert a["loop_opcodes"] == {"wgmma.mma_async": 2, "add": 1, "sub": 10, "abs": 10, "bra": 11}
    assert sum(a["loop_opcodes"].values()) == a["loop_dynamic"]
    assert kr.analyse_ptx("\tret;\n")["loop_opcodes"] == {}


def test_opcode_delta_ranks_the_changes_per_score():
    """Where a variant's extra instructions go: counts x threads / tile (per score), the largest
    absolute change first, unchanged opcodes left out."""
    base = dict(per_score=0.5, loop_opcodes={"fma": 20, "selp": 2, "xor": 0})
    row = dict(per_score=0.25, loop_opcodes={"fma": 40, "selp": 10, "mul.hi": 4})
    assert kr.opcode_delta(base, row) == [("selp", 1.5), ("mul.hi", 1.0)]  # fma: 20 x 0.5 = 40 x 0.25
    assert kr.opcode_delta(base, dict(row, loop_opcodes={})) == []


def test_parse_ptxas_log():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas /tmp/x.ptx, line 7; warning : Potential Performance Loss: wgmma.mma_async instructions are "
           "serialized due to the presence of Extern calls in the function 'k'. (C7515)\n"
           "    8 bytes stack frame, 48 bytes spill stores, 40 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers\n")
    r = kr.parse_ptxas_log(log)
    assert (r["registers"], r["spill_stores"], r["spill_loads"], r["stack"]) == (255, 48, 40, 8)
    assert len(r["warnings"]) == 1 and "serialized" in r["warnings"][0] and "/tmp" not in r["warnings"][0]
    row = dict(arch=90, dtype="bf16", head_dim=64, variant="rela_enc", dropout=0.0, kernel="rect_fwd",
               tile="128x64", warps=4, stages=3, error=None, shared=0, loop_wgmma=0, wgmma=0, loop_mma=0, mma=0,
               loop_dynamic=0, ptx_per_score=0.0, compile_s=0.0, **r)
    assert len(kr.problems([row])) == 1
    assert kr.problems([dict(row, warnings=[], spill_stores=0, spill_loads=0)]) == []


def test_known_exceptions_are_reported_as_known_and_pass_check_others_fail(monkeypatch):
    """A spilling row of a :data:`kr.KNOWN` (variant, d, p) in its named kernel is listed as known
    with its reason; the same spill in another kernel, head dim or arch outside the main
    configurations is not (new problem / not a target at all).  ``KNOWN`` is empty today: the
    test puts in the entry it had until issue 28's d 128 tile."""
    (variant, d, p), (kernel, why) = ("rela_enc", 128, 0.1), ("rect_bwd", "spills at d 128 with dropout")
    monkeypatch.setattr(kr, "KNOWN", {(variant, d, p): (kernel, why)})
    row = dict(arch=90, dtype="fp16", head_dim=d, variant=variant, dropout=p, kernel=kernel, tile="32x128",
               warps=8, stages=2, error=None, shared=0, loop_wgmma=28, wgmma=28, loop_mma=0, mma=0,
               loop_dynamic=747, ptx_per_score=46.7, compile_s=0.1, registers=255, spill_stores=24,
               spill_loads=16, stack=0, warnings=[], loop_instructions=747, inner_loops=[])
    assert kr.known_exception(row) == why
    assert kr.main_problems([row]) == ([], {why: kr.problems([row])})
    other = dict(row, kernel="rect_fwd")
    new, known = kr.main_problems([row, other])
    assert new == kr.problems([other]) and len(known[why]) == 1
    assert kr.known_exception(dict(row, arch=80)) is None and kr.main_problems([dict(row, arch=80)]) == ([], {})
    assert kr.known_exception(dict(row, error="boom")) is None
    clean = dict(row, kernel="rect_bwd_q", spill_stores=0, spill_loads=0)
    text = kr.render([row, clean], {"command": "x"})
    targets = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert "FAIL" not in targets and "met, except 1 known exception(s)" in targets and why in targets
    text = kr.render([row, other], {"command": "x"})
    targets = text.split("## Targets", 1)[1].split("\n## ", 1)[0]
    assert "- FAIL: " in targets and "the rest met, except 1 known" in targets
    assert "- met" in kr.render([clean], {"command": "x"})
    assert "- sm_80 (no target: the autotuner times every tried tile there): 1 of 2 compiles spill, 0 fail" in \
        kr.render([row, dict(row, arch=80), dict(clean, arch=80)], {"command": "x"})
    assert text.startswith("# Fused attention kernels compiled for H100 (sm_90a)\n")  # only what was compiled
    assert kr.render([row, dict(clean, arch=80)], {"command": "x"}).startswith(
        "# Fused attention kernels compiled for H100 (sm_90a) and A100 (sm_80)\n")


def test_dropout_overhead_and_tile_choices_with_several_tiles_per_launch():
    """``--tiles all``: dropout rows pair with the p = 0 row of the *same* tile (warps and stages
    included), and each launch's best spill-free tile is the one with the fewest PTX per score."""
    base = dict(arch=80, dtype="fp16", head_dim=64, variant="rela_enc", kernel="rect_fwd", tile="128x64",
                error=None, spill_loads=0, warnings=[])
    rows = [dict(base, dropout=0.0, warps=4, stages=3, spill_stores=20, ptx_per_score=14.0),
            dict(base, dropout=0.0, warps=8, stages=3, spill_stores=0, ptx_per_score=17.0),
            dict(base, dropout=0.0, tile="128x32", warps=4, stages=4, spill_stores=0, ptx_per_score=15.5),
            dict(base, dropout=0.1, warps=4, stages=3, spill_stores=136, ptx_per_score=28.0),
            dict(base, dropout=0.1, warps=8, stages=3, spill_stores=0, ptx_per_score=25.5)]
    rows[1]["sass_per_score"], rows[4]["sass_per_score"] = 16.0, 20.0  # SASS counted for that pair only
    over = kr._dropout_overhead(rows)
    assert over == ["| sm_80 | fp16 | 64 | rela_enc | rect_fwd | 128x64 4/3 | 14.0 | 28.0 | +100 % | n/a | n/a | n/a |  |",
                    "| sm_80 | fp16 | 64 | rela_enc | rect_fwd | 128x64 8/3 | 17.0 | 25.5 | +50 % | 16.0 | 20.0 | +25 % |  |"]
    p0, p1 = kr.tile_choices(rows)
    assert (p0["first"], p0["best"], p0["clean"], p0["tiles"]) == (rows[0], rows[2], 2, 3)
    assert (p1["first"], p1["best"], p1["clean"], p1["tiles"]) == (rows[3], rows[4], 1, 2)
    assert kr.tile_choices(rows[:1]) == [] and kr._tile_lines(rows[:1]) == []
    assert kr.tile_choices([dict(r, spill_stores=8) for r in rows[:2]])[0]["best"] is None
    assert "| 128x32 4/4 | 15.5 | 1.11 |" in "\n".join(kr._tile_lines(rows))


def test_tiles_not_tried_stay_out_of_the_targets_and_the_tile_choices():
    """``--tiles table`` rows the autotuner does not try (``tried`` False): a spill there is no
    target failure, they are never a launch's first or best tile, and the page marks them."""
    base = dict(arch=90, dtype="fp16", head_dim=128, variant="rela_enc", dropout=0.1, kernel="rect_bwd",
                error=None, spill_loads=0, warnings=[], registers=255, shared=114688, loop_wgmma=28, wgmma=28,
                loop_mma=0, mma=0, loop_instructions=700, loop_dynamic=700, inner_loops=[], sass_per_score=None,
                target="sm_90a", compile_s=0.6)
    rows = [dict(base, tile="32x128", warps=8, stages=2, spill_stores=32, ptx_per_score=46.19, tried=False),
            dict(base, tile="16x128", warps=8, stages=1, spill_stores=0, ptx_per_score=59.75, tried=True),
            dict(base, tile="32x32", warps=4, stages=1, spill_stores=0, ptx_per_score=75.38, tried=True),
            dict(base, tile="64x128", warps=8, stages=1, spill_stores=0, ptx_per_score=36.94, tried=False)]
    assert kr.main_problems(rows) == ([], {})
    assert kr.main_problems([dict(rows[0], tried=True)])[0]  # the same row, tried: a failure
    (c,) = kr.tile_choices(rows)
    assert (c["first"], c["best"], c["clean"], c["tiles"]) == (rows[1], rows[1], 2, 2)
    page = kr.render(rows, {"command": "x"})
    assert "| 32x128 8/2 (not tried) | 255 | 32/0 |" in page and "| 16x128 8/1 | 255 | 0/0 |" in page
    assert ("tiles the autotuner leaves out (`--tiles table`, marked \"not tried\"; outside the targets): "
            "2 compiles, 1 spill or fail to compile; spill-free now, so no longer a reason to leave them out: "
            "sm_90 fp16 d 128 rela_enc p 0.1 rect_bwd 64x128 w8 s1") in page
    with pytest.raises(ValueError, match="valid choices: first, all, table"):
        kr.report(tiles="every")


@needs_nvidia
def test_tiles_left_out_at_d128_with_dropout_still_spill(monkeypatch):
    """``--tiles table`` compiles the tiles the autotuner leaves out: the fused backward's 32x128 w8 s2
    and 32x64 w4 s2 at d 128 with dropout (``_SPILL_AT_D128_WITH_DROPOUT``) still spill there (sm_90a
    fp16, rela_enc: 32 / 132 B stores when measured), so leaving them out is still justified; the
    first tile tried, 16x128 w8 s1, spills nothing."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    mod = tk._kernels(False)
    rows = [r for r in kr.report(archs=(90,), dtypes=("fp16",), head_dims=(128,), variants=("rela_enc",),
                                 dropouts=(0.1,), tiles="table", bwds=("fused",)) if r["kernel"] == "rect_bwd"]
    assert [(tuple(map(int, r["tile"].split("x"))) + (r["warps"], r["stages"])) for r in rows] == mod._RECT_BWD
    by = {(r["tile"], r["warps"], r["stages"]): r for r in rows}
    (left,) = [sp for tb, sp in mod._SPILL_AT_D128_WITH_DROPOUT if tb is mod._RECT_BWD]
    for m, n, w, st in left:
        r = by[(f"{m}x{n}", w, st)]
        assert not r["tried"] and not r["error"] and r["spill_stores"] > 0, r
    first = by[("16x128", 8, 1)]
    assert first["tried"] and first["spill_stores"] == first["spill_loads"] == 0
    assert kr.main_problems(rows) == ([], {})


def test_bwd_comparison_pairs_the_fused_kernel_with_the_split_pair():
    """One comparison per configuration with all three backward kernels; the split pair's PTX per
    score is the sum of its two kernels'; rendered as a Markdown section (none without a pair)."""
    base = dict(arch=90, dtype="fp16", head_dim=64, variant="rela_enc", dropout=0.1, error=None, warps=8,
                stages=2, registers=200, spill_stores=0, spill_loads=0, shared=57344, loop_wgmma=20,
                loop_mma=0, wgmma=20, mma=0)
    rows = [dict(base, kernel="rect_bwd", tile="32x128", gemms=5, ptx_per_score=40.0),
            dict(base, kernel="rect_bwd_kv", tile="64x64", gemms=4, ptx_per_score=30.0),
            dict(base, kernel="rect_bwd_q", tile="64x64", gemms=3, ptx_per_score=20.0, loop_mma=8),
            dict(base, kernel="rect_bwd_q", tile="32x64", gemms=3, ptx_per_score=99.0),  # a later tile
            dict(base, kernel="rect_bwd", dropout=0.0, tile="32x128", gemms=5, ptx_per_score=30.0)]
    (c,) = kr.bwd_comparison(rows)
    assert (c["dropout"], c["split_per_score"], c["ratio"]) == (0.1, 50.0, 0.8)
    lines = kr._bwd_lines(rows)
    assert lines[1] == "## Backward: fused vs split"
    assert lines[-1].startswith("| sm_90a | fp16 | 64 | rela_enc | 0.1 | 32x128 8/2 |")
    assert "| 4+3 | 20+20 (+8 mma) | 50.0 | 0.8 |" in lines[-1]
    assert kr._bwd_lines(rows[:1]) == []
    # E-ATT's pair: l1_bwd vs l1_bwd_kv + l1_bwd_q, in PTX and SASS
    l1 = [dict(base, variant="eatt_enc", kernel=k, tile="64x64", gemms=g, ptx_per_score=x, sass_per_score=y)
          for k, g, x, y in (("l1_bwd", 2, 60.0, 40.0), ("l1_bwd_kv", 2, 50.0, 30.0), ("l1_bwd_q", 1, 50.0, 20.0))]
    (c,) = kr.bwd_comparison(l1)
    assert (c["fused"]["kernel"], c["split_per_score"], c["ratio"], c["sass_ratio"]) == ("l1_bwd", 100.0, 0.6, 0.8)
    assert kr._bwd_lines(l1)[-1].endswith("| 100.0 | 0.6 | 0.8 |")


def test_issue_bound_is_the_time_to_issue_every_score_of_the_core_benchmark():
    """E-ATT's issue bound: fwd + both backward kernels' SASS per score x B*H*T x T over the
    GPU's issue rate; only sm_90a eatt_enc rows with all three kernels count (first tile each)."""
    base = dict(arch=90, dtype="bf16", head_dim=64, variant="eatt_enc", dropout=0.0, error=None)
    rows = [dict(base, kernel="l1_fwd", sass_per_score=300.0),
            dict(base, kernel="l1_bwd_kv", sass_per_score=800.0),
            dict(base, kernel="l1_bwd_q", sass_per_score=900.0),
            dict(base, kernel="l1_bwd_q", sass_per_score=5000.0),  # a later tile: not the first
            dict(base, kernel="l1_fwd", variant="eatt_causal", sass_per_score=1.0),  # not the core's pattern
            dict(base, kernel="l1_fwd", arch=80, sass_per_score=1.0),
            dict(base, kernel="l1_fwd", head_dim=32, sass_per_score=1.0)]  # d 32: no backward rows
    gpu = dict(sms=2, lanes=10, ghz=1e-6)  # 2e4 instructions per second
    (b,) = kr.issue_bound(rows, T=4, core_rows=10, gpu=gpu)
    assert (b["dtype"], b["head_dim"], b["bwd"], b["sass_per_score"]) == ("bf16", 64, "split", 2000.0)
    assert b["ms"] == pytest.approx(2000.0 * 40 / 2e4 * 1e3)
    lo, hi = kr.IDEAL_L1_PER_DIM
    assert b["ideal_ms"] == pytest.approx((lo * 64 * 40 / 2e4 * 1e3, hi * 64 * 40 / 2e4 * 1e3))
    # the H100 at the core section's T 1024: 2000 SASS per score cannot take less than 64 ms
    assert kr.issue_bound(rows, T=1024)[0]["ms"] == pytest.approx(2000 * 2**30 / (132 * 128 * 1.98e9) * 1e3)
    lines = kr._issue_bound_lines(rows)
    assert lines[1].startswith("## What the CUDA cores allow E-ATT") and lines[-1].startswith("| bf16 | 64 | 0 | split | 2000.0 |")
    assert kr._issue_bound_lines(rows[:2]) == []
    # with the fused backward's row: a second line, l1_fwd + l1_bwd
    split, fused = kr.issue_bound(rows + [dict(base, kernel="l1_bwd", sass_per_score=1000.0)], T=4, core_rows=10, gpu=gpu)
    assert (split["bwd"], fused["bwd"], fused["sass_per_score"]) == ("split", "fused", 1300.0)


@needs_nvidia
def test_launches_are_those_of_the_real_entry_points():
    """Forward + backward of each family, each with the fused backward (two kernels) or the split
    one (three); compiled-mode meta, model-layout strides (unit
    stride on the head dimension, which the JIT turns into a constant)."""
    rec = kr.launches("reluformer_enc", 0.1, "bf16", 64)
    assert [n for n, _, _ in rec] == ["rect_fwd", "rect_bwd"]
    assert rec[1][1][8].dtype == torch.float32  # DQ: the float32 buffer the atomic adds go into
    assert [n for n, _, _ in kr.launches("rela_causal", 0.0, "fp16", 64, bwd="split")] == [
        "rect_fwd", "rect_bwd_kv", "rect_bwd_q"]
    assert tk.rect_backward() == "fused"  # the recording put the setting back
    name, args, meta = rec[0]
    assert meta["HAS_R"] and meta["STATS"] and meta["DROPOUT"] and meta["MASK_MODE"] == 1 and not meta["UPCAST"]
    assert "BLOCK_M" not in meta  # the autotuner's, set per tile by the report
    q = args[0]
    assert q.stride()[-1] == 1 and q.stride(2) == kr.SHAPE["B"] * kr.SHAPE["H"] * 64
    assert [n for n, _, _ in kr.launches("eatt_dec", 0.0, "fp16", 32, bwd="split")] == ["l1_fwd", "l1_bwd_kv", "l1_bwd_q"]
    fused = kr.launches("eatt_dec", 0.0, "fp16", 32)
    assert [n for n, _, _ in fused] == ["l1_fwd", "l1_bwd"] and fused[1][2]["DQ_ATOMIC"]
    assert fused[1][1][10].dtype == torch.float32  # DQA: the float32 buffer of the atomic dQ sums
    assert tk.l1_backward() == "split"  # the recording put the setting back (E-ATT's default)
    assert kr.launches("eatt_dec", 0.0, "fp16", 32)[0][2]["MASK_MODE"] == 2
    with pytest.raises(ValueError, match="valid choices"):
        kr.launches("nope", 0.0, "bf16", 64)
    with pytest.raises(ValueError, match="valid choices: fused, split"):
        kr.launches("rela_enc", 0.0, "bf16", 64, bwd="atomic")


@needs_nvidia
def test_tried_tiles_depend_on_the_head_dimension():
    """Issue 28: at d 128 (``BLOCK_D >= 128``) the autotuner does not try the tiles that spill there
    (``_SPILL_AT_D128``; with dropout also ``_SPILL_AT_D128_WITH_DROPOUT``), keeps at least one, and the report's "first tile" is the first tried one;
    below 128 the tables are unchanged."""
    import triton

    mod = tk._kernels(False)
    for table, spill in mod._SPILL_AT_D128:
        assert spill <= set(table)  # only tiles of that table
        d64 = mod._tried(table, {"BLOCK_D": 64})
        d128 = mod._tried(table, {"BLOCK_D": 128})
        assert d64 == list(table) and d128 and not set(d128) & spill
        assert mod._tried(table, {"BLOCK_D": 256}) == d128
    assert mod._tried(mod._RECT_BWD_KV, {"BLOCK_D": 128})[0] == (32, 32, 4, 1)
    # tiles that spill at d 128 only with dropout: left out only when both hold
    for table, spill in mod._SPILL_AT_D128_WITH_DROPOUT:
        assert spill <= set(table)
        assert not set(mod._tried(table, {"BLOCK_D": 128, "DROPOUT": True})) & spill
        assert spill <= set(mod._tried(table, {"BLOCK_D": 128})) and spill <= set(mod._tried(table, {"BLOCK_D": 64}))
    assert mod._tried(mod._RECT_BWD, {"BLOCK_D": 128, "DROPOUT": True})[0] == (16, 128, 8, 1)
    assert mod._tried(mod._RECT_BWD, {"BLOCK_D": 64, "DROPOUT": True})[0] == (32, 128, 8, 2)
    assert mod._tried(mod._RECT_BWD, {"BLOCK_D": 128})[0] == (32, 128, 8, 2)
    assert mod._tried(mod._RECT_FWD, {"BLOCK_D": 128, "STATS": True})[0] == (128, 64, 8, 3)
    # the autotuner's pruning (bound to the table by _tuned) agrees, and never returns nothing
    configs = [triton.Config({"BLOCK_M": a, "BLOCK_N": b}, num_warps=w, num_stages=st)
               for a, b, w, st in mod._RECT_BWD_Q]
    kept = mod._prune(configs, {"T_KEY": 1024, "S_KEY": 1024, "BLOCK_D": 128}, table=mod._RECT_BWD_Q)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept] == \
        mod._tried(mod._RECT_BWD_Q, {"BLOCK_D": 128})
    tiny = mod._prune(configs, {"T_KEY": 1, "S_KEY": 1, "BLOCK_D": 128}, table=mod._RECT_BWD_Q)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in tiny] == [(16, 32, 4, 1)]
    name, args, meta = kr.launches("rela_enc", 0.0, "fp16", 128, bwd="split")[1]
    assert name == "rect_bwd_kv" and meta["BLOCK_D"] == 128
    assert mod._tried(kr._tables(mod)[name], meta)[0] == (32, 32, 4, 1)


@needs_nvidia
def test_spill_lists_apply_on_the_gpu_they_were_measured_on(monkeypatch):
    """The spill lists are sm_90a measurements: on another GPU (sm_80) the autotuner tries the whole
    table, whatever the launch, and the pruning asks the launch's device (its first CUDA tensor);
    the report compiles each target with that target's candidates."""
    import triton

    mod = tk._kernels(False)
    meta = {"BLOCK_D": 128, "DROPOUT": True, "STATS": True}
    for table in kr._tables(mod).values():
        assert mod._tried(table, meta, arch=80) == list(table)
    assert mod._tried(mod._RECT_BWD_KV, meta) == mod._tried(mod._RECT_BWD_KV, meta, arch=mod.SPILL_LISTS_ARCH) \
        != list(mod._RECT_BWD_KV)
    configs = [triton.Config({"BLOCK_M": a, "BLOCK_N": b}, num_warps=w, num_stages=st)
               for a, b, w, st in mod._RECT_BWD_KV]
    tiles = lambda cs: [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in cs]  # noqa: E731
    launch = dict(meta, T_KEY=1024, S_KEY=1024)
    assert tiles(mod._prune(configs, launch, table=mod._RECT_BWD_KV)) == mod._tried(mod._RECT_BWD_KV, meta)
    monkeypatch.setattr(mod, "_launch_arch", lambda named_args: 80)
    assert tiles(mod._prune(configs, launch, table=mod._RECT_BWD_KV)) == list(mod._RECT_BWD_KV)
    # no CUDA tensor among the arguments (here): the lists' own arch
    monkeypatch.undo()
    assert mod._launch_arch({"Q": torch.zeros(1), "T_KEY": 4}) == mod.SPILL_LISTS_ARCH
    # the report: each target's first tile is the first of that target's candidates (compiles stubbed)
    monkeypatch.setattr(kr, "_compile_row", lambda task: dict(task[0], tile_tuple=task[6]))
    rows = kr.report(archs=[90, 80], dtypes=["fp16"], head_dims=[128], variants=["reluformer_enc"], dropouts=[0.1],
                     tiles="first", bwds=["split"])
    first = {(r["arch"], r["kernel"]): r["tile_tuple"] for r in rows}
    assert first[(80, "rect_bwd_kv")] == tuple(mod._RECT_BWD_KV[0])
    assert first[(90, "rect_bwd_kv")] == tuple(mod._tried(mod._RECT_BWD_KV, {"BLOCK_D": 128, "DROPOUT": True,
                                                                             "STATS": True})[0]) != first[(80, "rect_bwd_kv")]


@needs_nvidia
def test_tiles_that_spill_with_dropout_are_left_out_per_table():
    """Issue 28: with attention dropout the autotuner leaves out the tiles that spill *in that
    kernel* (``_SPILL_WITH_DROPOUT`` is per table: 128x64 w8 s2 spills in rect_bwd_kv but not in
    rect_bwd_q, which keeps it); the first tile, what the report checks, is never left out."""
    mod = tk._kernels(False)
    assert {id(tb) for tb, _ in mod._SPILL_WITH_DROPOUT} <= {id(tb) for tb in kr._tables(mod).values()}
    for table, spill in mod._SPILL_WITH_DROPOUT:
        assert spill <= set(table) and tuple(table[0]) not in spill
        tried = mod._tried(table, {"DROPOUT": True, "BLOCK_D": 64})
        assert tried == [t for t in table if tuple(t) not in spill]
        assert mod._tried(table, {"DROPOUT": False, "BLOCK_D": 64}) == list(table)
    assert (128, 64, 8, 2) not in mod._tried(mod._RECT_BWD_KV, {"DROPOUT": True})
    assert (128, 64, 8, 2) in mod._tried(mod._RECT_BWD_Q, {"DROPOUT": True})
    # the eq. 7 statistics' spills are per table too: rect_bwd_kv 128x64 w8 s2 / 64x32 w4 s2 spill
    # with ReLUFormer at d 32 / 64 (--tiles table), rect_bwd_q compiles them clean and keeps them
    assert {id(tb) for tb, _ in mod._SPILL_WITH_STATS} <= {id(tb) for tb in kr._tables(mod).values()}
    for table, spill in mod._SPILL_WITH_STATS:
        assert spill <= set(table)
        assert not set(mod._tried(table, {"STATS": True, "BLOCK_D": 64})) & spill
    for tile in ((128, 64, 8, 2), (64, 32, 4, 2)):
        assert tile not in mod._tried(mod._RECT_BWD_KV, {"STATS": True, "BLOCK_D": 64})
        assert tile in mod._tried(mod._RECT_BWD_Q, {"STATS": True, "BLOCK_D": 64})
        assert tile in mod._tried(mod._RECT_BWD_KV, {"STATS": False, "BLOCK_D": 64})


def _main_cases():
    for variant in kr.MAIN["variants"]:
        for d in kr.MAIN["head_dims"]:
            # d 64 with and without dropout; d 32 / 128 with dropout only (its code is a superset:
            # the tiles spilled most there), for time: 3 compiles per case
            for p in (kr.DROPOUTS if d == 64 else kr.DROPOUTS[-1:]):
                for dtype in ("fp16",):  # fairseq trains with --fp16; bf16 compiles alike (the report has both)
                    yield pytest.param(variant, d, p, dtype, id=f"{variant}-d{d}-p{p:g}-{dtype}")


@needs_nvidia
@pytest.mark.parametrize("variant,d,p,dtype", list(_main_cases()))
def test_main_configurations_compile_for_sm90a_without_spills_or_serialized_wgmma(variant, d, p, dtype, monkeypatch):
    """Issue 28's targets on the main configurations (``kr.MAIN``: sm_90a, d 32/64/128, the first
    autotuning tile tried for that head dimension, JIT specialisations): every kernel of forward +
    backward (on both backward paths) compiles, spills nothing and gets no ``wgmma ... serialized``
    warning from ptxas; the rectified fused backward runs 5 GEMMs per iteration, the split pair
    4 + 3; E-ATT's fused backward issues under 0.8x the split pair's SASS per score."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = kr.report(archs=(kr.MAIN["arch"],), dtypes=(dtype,), head_dims=(d,),
                     variants=(variant,), dropouts=(p,), tiles=kr.MAIN["tiles"])
    rectified = kr.VARIANTS[variant][0] == "rectified"
    assert len(rows) == 4 and all(r["target"] == "sm_90a" for r in rows if not r["error"])
    # tensor cores in the main loop: wgmma; mma.sync in tiles with fewer than 64 rows per product
    # (d 128: rect_bwd_kv's spill-free tiles are 32x32 and 16x32, _SPILL_AT_D128)
    assert all(r["loop_wgmma"] + r["loop_mma"] > 0 for r in rows if not r["error"])
    assert all(r["loop_wgmma"] > 0 for r in rows if not r["error"] and min(map(int, r["tile"].split("x"))) >= 64)
    known = kr.KNOWN.get((variant, d, p))
    if known:  # only the known kernel breaks the targets here -- and it still does
        bad = [r for r in rows if kr.problems([r])]
        assert bad and {r["kernel"] for r in bad} == {known[0]}, (known, kr.problems(rows))
    else:
        assert kr.problems(rows) == []
    if rectified:
        assert {r["kernel"]: r["gemms"] for r in rows if r["kernel"] != "rect_fwd"} == {
            "rect_bwd": 5, "rect_bwd_kv": 4, "rect_bwd_q": 3}
        (comp,) = kr.bwd_comparison(rows)
        assert comp["ratio"] < 1  # fewer PTX instructions per score than the split pair
    else:  # E-ATT: the fused backward shares the distance, P and dP: fewer SASS per score than the pair
        assert {r["kernel"]: r["gemms"] for r in rows if r["kernel"] != "l1_fwd"} == {
            "l1_bwd": 2, "l1_bwd_kv": 2, "l1_bwd_q": 1}
        (comp,) = kr.bwd_comparison(rows)
        assert comp["sass_ratio"] < 0.8


@needs_nvidia
def test_fused_norm_compiles_for_sm90a_without_spills(monkeypatch):
    """Issue 28 item 3: ReLA-g's fused gated RMSNorm (C = 8 x 64 = 512, scope concat and per
    head, fp16/bf16) compiles for sm_90a without spills; launches recorded from the real entry
    point (forward + backward), no dropout variant."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rec = kr.launches("rela_g_norm_head", 0.0, "bf16", 64)
    assert [n for n, _, _ in rec] == ["norm_fwd", "norm_bwd"]
    assert rec[0][2]["GATE"] and rec[0][2]["BLOCK_G"] == kr.SHAPE["H"] and rec[0][2]["BLOCK_N"] == 64
    rows = kr.report(archs=(90,), dtypes=("fp16", "bf16"), head_dims=(64,),
                     variants=("rela_g_norm", "rela_g_norm_head"), dropouts=(0.0, 0.1))
    assert len(rows) == 8 and kr.problems(rows) == [] and kr.bwd_comparison(rows) == []
    assert all(r["target"] == "sm_90a" and 0 < r["registers"] <= 128 for r in rows)


@needs_nvidia
def test_parallel_compiles_give_the_same_report(monkeypatch):
    """``--jobs``: the rows compiled in worker processes (recorded launches detached and pickled)
    equal those compiled here, in the same order; ``jobs < 1`` is refused before any compile."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kw = dict(archs=(90,), dtypes=("fp16",), head_dims=(32,), variants=("rela_g_norm", "eatt_enc"), dropouts=(0.0,))
    one, two = kr.report(**kw), kr.report(**kw, jobs=2)
    assert len(one) == 6 and not any(r["error"] for r in one)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "compile_s"} for r in rows]  # noqa: E731
    assert strip(two) == strip(one)
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        kr.report(**kw, jobs=0)


@needs_nvidia
def test_row_terms_compile_for_sm90a_without_spills(monkeypatch):
    """ReLUFormer's eq. 7 row terms (kernel family "stats"): one forward + backward recorded from
    the real entry point on the attention's float32 (B, H, T) row sums (n (B, 1, T) per query,
    query padding, both gradients), compiled for sm_90a with the launch's own BLOCK and warps:
    no spills, no ptxas warning, no dropout variant; counted per row over the whole kernel."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="triton without its NVIDIA backend")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import fairseq_plugins.attention.triton.stats as st

    saved = (st._stats_kernels, st._mode)
    rec = kr.launches("reluformer_terms", 0.0, "bf16", 64)
    assert (st._stats_kernels, st._mode) == saved  # the recording put them back
    assert [n for n, _, _ in rec] == ["row_terms_fwd", "row_terms_bwd"]
    B, H, T = kr.SHAPE["B"], kr.SHAPE["H"], kr.SHAPE["T"]
    (_, fa, fm), (_, ba, bm) = rec
    assert fm["HAS_QP"] and bm["HAS_QP"] and bm["HAS_GN"] and bm["HAS_GM"]
    assert fm["BLOCK"] == bm["BLOCK"] == st.BLOCK and fm["num_warps"] == bm["num_warps"] == st.NUM_WARPS
    assert fa[0].dtype == fa[1].dtype == torch.float32 and fa[0].shape == (B, H, T) and fa[0].is_contiguous()
    assert fa[2].shape == (B, H, T) and fa[2].stride() == (T, 0, 1)  # n (B, 1, T), broadcast over heads
    assert fa[3].shape == (B, T) and fa[4].shape == (-(-B * H * T // st.BLOCK), 6)  # padding, PART
    assert ba[4].dim() == ba[5].dim() == 0  # g_norm, g_margin
    rows = kr.report(archs=(90,), dtypes=("bf16",), head_dims=(64,), variants=("reluformer_terms",),
                     dropouts=(0.0, 0.1))
    assert [r["kernel"] for r in rows] == ["row_terms_fwd", "row_terms_bwd"] and kr.problems(rows) == []
    for r in rows:
        assert r["error"] is None and r["target"] == "sm_90a" and r["registers"] > 0 and not r["warnings"]
        assert (r["spill_stores"], r["spill_loads"], r["stack"]) == (0, 0, 0)
        assert (r["tile"], r["warps"], r["stages"], r["gemms"], r["wgmma"]) == (str(st.BLOCK), st.NUM_WARPS, 1, 0, 0)
        # one pass per program: the whole kernel, per row (threads / BLOCK rows)
        assert r["loop_dynamic"] == r["instructions"] > 0 and r["inner_loops"] == []
        assert r["ptx_per_score"] == round(r["instructions"] * 32 * st.NUM_WARPS / st.BLOCK, 2)
        assert r["sass_per_score"] and r["sass_per_score"] > 0
    assert kr.main_problems(rows) == ([], {})  # not a main configuration
    text = kr.render(rows, {"command": "x"})
    assert "| bf16 | 64 | reluformer_terms | 0 | row_terms_fwd | 1024 4/1 |" in text
    assert "| bf16 | 64 | reluformer_terms | 0 | row_terms_bwd | 1024 4/1 |" in text
    assert "## Dropout overhead" not in text and "## Backward: fused vs split" not in text
