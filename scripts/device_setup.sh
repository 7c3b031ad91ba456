#!/usr/bin/env bash
# Install this checkout on an offline GPU machine from the kit written by `mt-campaign gpu-kit`
# (docs/gpu.md): the kit's wheels, fairseq-fixed built in place from its sdist, the fairseq-* CLIs,
# this checkout importable, the corpus's raw files where mt-prep looks for them (../shared/data).
# Usage (from the checkout root, on the GPU machine): bash scripts/device_setup.sh .device
# Idempotent: a second call only re-checks the imports.
set -euo pipefail
KIT=$(cd "${1:?usage: bash scripts/device_setup.sh KIT_DIR}" && pwd)
ROOT=$(pwd)
[ -f "$KIT/KIT.json" ] || { echo "$KIT is not a GPU kit (no KIT.json): run mt-campaign gpu-kit here first" >&2; exit 2; }
PY=${PYTHON:-python3}
BINDIR=$($PY -c 'import sys,os; print(os.path.dirname(sys.executable))')
SITE=$($PY -c 'import site; print(site.getsitepackages()[0])')
$PY -m pip install -q --no-index --no-deps --no-compile "$KIT"/whl/*.whl 2>&1 | grep -v WARNING || true
FS=/tmp/fairseq_fixed-0.12.3.1
if [ ! -f "$FS/.built" ]; then
  tar xzf "$KIT"/whl/fairseq_fixed-0.12.3.1.tar.gz -C /tmp
  (cd "$FS" && env -u CUDA_HOME $PY setup.py build_ext --inplace > /tmp/fsbuild.log 2>&1) || { tail -30 /tmp/fsbuild.log; exit 1; }
  touch "$FS/.built"
fi
echo "$FS" > "$SITE/fairseq_fixed.pth"
echo "$ROOT" > "$SITE/project_checkout.pth"
for c in train generate preprocess interactive score hydra_train; do
  n=fairseq-${c//_/-}
  printf '#!/bin/bash\nexec %s -m fairseq_cli.%s "$@"\n' "$BINDIR/$(basename $PY)" "$c" > "$BINDIR/$n"; chmod +x "$BINDIR/$n"
done
printf '#!/bin/bash\nexec %s -m mt_pipeline.campaign "$@"\n' "$BINDIR/$(basename $PY)" > "$BINDIR/mt-campaign"; chmod +x "$BINDIR/mt-campaign"
mkdir -p "$ROOT/../shared/data"
# merged into what is there (a kit's wmt/plain beside another's wmt/sgm); files already there are kept
cp -a -n "$KIT"/data/. "$ROOT/../shared/data/"
$PY -c 'import fairseq, torch, fairseq_plugins, mt_pipeline; print("fairseq", fairseq.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
