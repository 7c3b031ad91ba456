#!/usr/bin/env bash
# The kernel work of one short lent-GPU window (docs/gpu.md, issue 28) in one command, most decisive first:
#   0. (WARM_S > 0, default 120) fill Triton's cache in parallel: mt-kernel-report compiles every tile the
#      autotuner tries for the benchmark's kernels (arch 90, bf16, d 64, dropout 0 / 0.1) in 14 processes,
#      each compile landing under the key the JIT looks up, so step 1's autotuning finds them compiled
#      (on 2026-11-26 the JIT compiled one tile at a time: 12-150 s per CUDA test); its report, compiled
#      by the machine's triton, comes back as kernel_report_device.md;
#   0b. (PROFILE_S > 0, default 0) where a layer step's host time goes (every layer row was host-bound on the
#      H100 of 2026-11-26): mt-bench-gpu --host-profile on the encoder layer at T 1024 (stock, rela_g and
#      reluformer Triton; PROFILE_ARGS replaces these options), torch.profiler ops + cProfile per cell,
#      into OUT_DIR/host_profile.txt;
#   1. (BENCH_S > 0) alone on the GPU, the decisive mt-bench-gpu subset (bf16, T 256/1024/4096; softmax, rela_g,
#      reluformer, eatt; core, layer, decode; BENCH_ARGS replaces these options, e.g. with what a
#      previous window did not reach: docs/gpu.md): every ratio against the baseline of the same run;
#      the result file is rewritten after every length, so a cut-off run still leaves a table;
#   2. (SPLIT_S > 0) the layer section again with MT_RECT_BACKWARD=split (vs the default fused);
#   2b. (FUSED_S > 0, default 0) E-ATT's core and layer rows with MT_L1_BACKWARD=fused (one l1_bwd
#      kernel, atomic dQ) vs step 1's default split pair;
#   3. (TEST_S > 0) the CUDA tests (TEST_K, default "cuda and not interpreter") under pytest-xdist (every compiled kernel against the float64
#      reference), stopped by SIGINT at TEST_S so pytest still prints its summary.
# MODE=isolate replaces all three: each CUDA test in its own process under CUDA_LAUNCH_BLOCKING=1
# (an illegal address poisons the CUDA context of its process, and every later test there fails),
# and compute-sanitizer memcheck on the test id ISOLATE_SANITIZE beside them.
#
# Needs no network and no fairseq build: the kit's wheels (`mt-campaign gpu-kit`) go to /tmp/site
# and fairseq-fixed's sdist is imported unbuilt (training needs the build: scripts/device_setup.sh).
# JIT compilation dominates a first window (12-150 s per CUDA test on the H200 of 2026-11-26), so
# Triton's kernel cache travels: KIT_DIR/triton_cache.tgz, if present, seeds TRITON_CACHE_DIR, and
# the cache is returned as OUT_DIR/triton_cache.tgz (copy it to .device/ for the next window; it is
# valid for the same triton version, GPU architecture and kernel source).
# Every step has its own time limit and writes to OUT_DIR as it goes.
# Usage (checkout root, on the GPU machine):
#   bash scripts/gpu_window.sh KIT_DIR OUT_DIR [BENCH_S=270] [SPLIT_S=60] [TEST_S=180]
set -uo pipefail
USAGE="usage: bash scripts/gpu_window.sh KIT_DIR OUT_DIR [BENCH_S] [SPLIT_S] [TEST_S]"
KIT=$(cd "${1:?$USAGE}" && pwd)
OUT=${2:?$USAGE}
BENCH_S=${3:-270}; SPLIT_S=${4:-60}; TEST_S=${5:-180}
[ -f "$KIT/KIT.json" ] || { echo "$KIT is not a GPU kit (no KIT.json): run mt-campaign gpu-kit first" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$KIT"/whl/*.whl 2>&1 | grep -v WARNING
tar xzf "$KIT"/whl/fairseq_fixed-0.12.3.1.tar.gz -C /tmp
export PYTHONPATH="$PWD:/tmp/fairseq_fixed-0.12.3.1:/tmp/site"
export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p "$TRITON_CACHE_DIR"
[ -f "$KIT/triton_cache.tgz" ] && tar xzf "$KIT/triton_cache.tgz" -C "$TRITON_CACHE_DIR"
save_cache() {  # at most 16 MiB comes back per file
  tar czf /tmp/triton_cache.tgz -C "$TRITON_CACHE_DIR" . && [ "$(stat -c %s /tmp/triton_cache.tgz)" -lt 16000000 ] \
    && cp /tmp/triton_cache.tgz "$OUT/" || echo "triton cache not returned (over 16 MB or unreadable)"
}
trap save_cache EXIT
GPU=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))' | tr 'A-Z ' 'a-z_' | tr -cd 'a-z0-9_')
{ date -u; nvidia-smi -L; git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head;
  python3 -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "triton cache entries at start: $(ls "$TRITON_CACHE_DIR" | wc -l)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "${MODE:-}" = isolate ]; then
  echo "== isolate: every CUDA test alone (limit ${TEST_S} s)"; t=$SECONDS
  python3 -m pytest -q --collect-only -p no:cacheprovider tests/test_triton_cuda.py tests/test_norm_fused.py \
    tests/test_row_terms_fused.py tests/test_triton_attention.py tests/test_eatt.py 2>/dev/null | grep '::' \
    | grep -E 'cuda|test_norm_fused.py::test_triton' > "$OUT/ids.txt"
  if [ -n "${ISOLATE_SANITIZE:-}" ]; then
    ( CUDA_LAUNCH_BLOCKING=1 timeout -s INT $((TEST_S - 10)) compute-sanitizer --tool memcheck --print-limit 5 \
        python3 -m pytest -q -x -p no:cacheprovider --tb=short "$ISOLATE_SANITIZE" > "$OUT/sanitizer.log" 2>&1 ) &
  fi
  export OUT
  timeout -s INT "$TEST_S" xargs -P 12 -I{} sh -c 'r=$(CUDA_LAUNCH_BLOCKING=1 timeout 150 python3 -m pytest -q \
      -p no:cacheprovider --tb=line "$1" 2>&1 | grep -E "^/.*(Error|error)|passed|failed|skipped" | tail -2 | tr "\n" " ");
      echo "$1 :: $r" >> "$OUT/isolated.txt"' _ {} < "$OUT/ids.txt"
  wait; echo "done after $((SECONDS - t)) s: $(wc -l < "$OUT/isolated.txt") of $(wc -l < "$OUT/ids.txt") tests"
  grep -c " failed" "$OUT/isolated.txt"; exit 0
fi

WARM_S=${WARM_S:-120}
if [ "$WARM_S" -gt 0 ]; then
  echo "== 0. warm Triton's cache: mt-kernel-report --tiles all --jobs 14 (limit ${WARM_S} s)"; t=$SECONDS
  timeout -s INT "$WARM_S" python3 -m mt_pipeline.kernel_report --arch 90 --dtypes bf16 --head-dims 64 \
    --variants rela_enc,rela_causal,reluformer_enc,eatt_enc,eatt_causal,rela_g_norm,rela_g_norm_head \
    --tiles all --jobs 14 --out "$OUT/kernel_report_device.md" > /tmp/warm.log 2>&1
  echo "rc $? after $((SECONDS - t)) s: $(grep -c ' regs ' /tmp/warm.log) compiles, cache $(du -sh "$TRITON_CACHE_DIR" | cut -f1)"
fi

PROFILE_S=${PROFILE_S:-0}
if [ "$PROFILE_S" -gt 0 ]; then
  echo "== 0b. host profile of layer steps (limit ${PROFILE_S} s)"; t=$SECONDS
  PROFILE_ARGS=${PROFILE_ARGS:---sections layer --T 1024 --layer-kinds enc --attention-dropout 0 --dtypes bf16 --functions rela_g,reluformer}
  # shellcheck disable=SC2086  # PROFILE_ARGS is a list of options
  timeout -s INT "$PROFILE_S" python3 -m mt_pipeline.bench_gpu $PROFILE_ARGS --rep 20 --host-profile "$OUT/host_profile.txt" \
    --out "$OUT/attention_speed_${GPU}_profiled.md" > "$OUT/bench_profile.log" 2>&1
  echo "rc $? after $((SECONDS - t)) s"; tail -3 "$OUT/bench_profile.log"
fi

if [ "$BENCH_S" -gt 0 ]; then  # 0 skips it (timeout 0 would mean no limit)
  echo "== 1. mt-bench-gpu (limit ${BENCH_S} s)"; t=$SECONDS
  # the core's "eatt torch" (chunked L1 on CUDA) is left out: on the H200 of 2026-11-28 its cell (warm-up, timed
  # steps, profiler) did not finish within 190 s at T 4096 (step 1) nor within 40 s at T 1024 (step 2b)
  BENCH_ARGS=${BENCH_ARGS:---T 256,1024,4096 --dtypes bf16 --functions softmax,rela_g,reluformer,eatt --core-cases sdpa_flash,relu_torch,reluformer+eq.7_torch,relu_flex,relu_triton,reluformer+eq.7_triton,eatt_triton}
  echo "mt-bench-gpu $BENCH_ARGS --rep 50"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  timeout -s INT "$BENCH_S" python3 -m mt_pipeline.bench_gpu $BENCH_ARGS --rep 50 --out "$OUT/attention_speed_$GPU.md" \
    > "$OUT/bench.log" 2>&1
  echo "rc $? after $((SECONDS - t)) s"; tail -5 "$OUT/bench.log"
fi

if [ "$SPLIT_S" -gt 0 ]; then
  echo "== 2. layer section, MT_RECT_BACKWARD=split (limit ${SPLIT_S} s)"; t=$SECONDS
  MT_RECT_BACKWARD=split timeout -s INT "$SPLIT_S" python3 -m mt_pipeline.bench_gpu --sections layer --T 1024,4096 \
    --dtypes bf16 --functions softmax,rela_g,reluformer --rep 50 --out "$OUT/attention_speed_${GPU}_split.md" \
    > "$OUT/bench_split.log" 2>&1
  echo "rc $? after $((SECONDS - t)) s"; tail -3 "$OUT/bench_split.log"
fi

FUSED_S=${FUSED_S:-0}
if [ "$FUSED_S" -gt 0 ]; then
  echo "== 2b. E-ATT, MT_L1_BACKWARD=fused (limit ${FUSED_S} s)"; t=$SECONDS
  MT_L1_BACKWARD=fused timeout -s INT "$FUSED_S" python3 -m mt_pipeline.bench_gpu --sections core,layer --T 1024,4096 \
    --dtypes bf16 --functions eatt --core-cases sdpa_flash,eatt_triton --rep 50 --out "$OUT/attention_speed_${GPU}_eatt_fused.md" \
    > "$OUT/bench_eatt_fused.log" 2>&1
  echo "rc $? after $((SECONDS - t)) s"; tail -3 "$OUT/bench_eatt_fused.log"
fi

if [ "$TEST_S" -gt 0 ]; then
  echo "== 3. CUDA tests (limit ${TEST_S} s)"; t=$SECONDS
  # the compiled tests only: the interpreter ones fail under the machines' triton 3.6 (TypeError in
  # triton's interpreter; CI runs them with triton 3.9), 2026-11-26 H200 window
  timeout -s INT "$TEST_S" python3 -m pytest -q -n 14 -p no:cacheprovider --tb=line -rfEs -k "${TEST_K:-cuda and not interpreter}" \
    tests/test_triton_cuda.py tests/test_norm_fused.py tests/test_row_terms_fused.py tests/test_triton_attention.py \
    tests/test_eatt.py tests/test_bench_gpu.py > "$OUT/cuda_tests.log" 2>&1
  echo "rc $? after $((SECONDS - t)) s"; tail -4 "$OUT/cuda_tests.log"
fi
