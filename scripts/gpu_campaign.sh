#!/usr/bin/env bash
# A campaign in a lent GPU window (docs/gpu.md, "Running the campaign on a lent GPU machine"): the
# converged plan, or the plan its options name (--plan configs/campaign/smoke.yaml).
#
# Usage (on the GPU machine, from the checkout root, with the kit of `mt-campaign gpu-kit` carried):
#   bash scripts/gpu_campaign.sh KIT OUT SECONDS [mt-campaign run options...]
# e.g. bash scripts/gpu_campaign.sh .device $OUT 540 --jobs 12 --minutes 11
#      bash scripts/gpu_campaign.sh .device $OUT 540 --jobs 12 --plan configs/campaign/smoke.yaml
#
# Every call may be the first or a later one on the same warm machine:
# * the first copies this checkout (with .git, the kit and a carried data-bin/) to $GPU_CAMPAIGN_DIR
#   (default /root/mt-campaign-checkout) and works there: the device tool re-syncs the working tree at
#   the start of every call, which deletes the untracked evidence and reverts the re-rendered pages
#   that a campaign writes into results/ between calls (seen on 2026-11-28);
# * it installs the kit there (scripts/device_setup.sh, idempotent) and starts
#   `mt-campaign run --nice 0 OPTIONS` in its own session, once per machine;
# * it then waits until the campaign ends or SECONDS (counted from this call's start) pass, and
#   writes to OUT: evidence.tgz (results/runs/ and every page under results/ the campaign changed in the
#   copy, all of it, so the last call's archive holds every run finished on this machine), run.log, status.txt,
#   gpu_util.txt (GPU use and load every 15 s) and runlogs.tgz (the run directories' logs and JSON,
#   no checkpoints).
# Here afterwards: `tar xzf <files_at>/evidence.tgz && mt-campaign render`, then commit.
set -u
KIT=$(cd "${1:?usage: bash scripts/gpu_campaign.sh KIT OUT SECONDS [mt-campaign run options]}" && pwd)
OUT=${2:?OUT folder}
SECONDS_LEFT=${3:?SECONDS to wait}
shift 3
case "$SECONDS_LEFT" in ''|*[!0-9]*) echo "SECONDS must be a whole number of seconds, got '$SECONDS_LEFT'" >&2; exit 2;; esac
[ -f "$KIT/KIT.json" ] || { echo "$KIT is not a GPU kit (no KIT.json): run mt-campaign gpu-kit here first" >&2; exit 2; }
END=$(( $(date +%s) + SECONDS_LEFT ))
WORK=${GPU_CAMPAIGN_DIR:-/root/mt-campaign-checkout}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)   # absolute: the script works from the copy
if [ ! -d "$WORK/.git" ]; then
  mkdir -p "$(dirname "$WORK")" && cp -a . "$WORK" || { echo "could not copy the checkout to $WORK" >&2; exit 1; }
fi
cd "$WORK" || exit 1
{ date; nvidia-smi; nproc; free -g; } >> "$OUT/env.txt" 2>&1
bash scripts/device_setup.sh "$KIT" > "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
tail -1 "$OUT/setup.log"
mkdir -p runs/campaign
if [ ! -f runs/campaign/gpu_started ]; then
  date > runs/campaign/gpu_started
  setsid nohup python3 -m mt_pipeline.campaign run --nice 0 "$@" > runs/campaign/gpu_run.log 2>&1 < /dev/null &
  sleep 5
fi
while [ "$(date +%s)" -lt "$END" ] && pgrep -f "mt_pipeline.campaign run" > /dev/null; do
  echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader) $(cut -d' ' -f1-3 /proc/loadavg)" \
    >> runs/campaign/gpu_util.txt
  sleep 15
done
PLAN_ARGS=(); prev=""   # the status of the plan the campaign runs (its --plan, else the default)
for a in "$@"; do [ "$prev" = "--plan" ] && PLAN_ARGS=(--plan "$a"); case "$a" in --plan=*) PLAN_ARGS=("$a");; esac; prev=$a; done
python3 -m mt_pipeline.campaign status "${PLAN_ARGS[@]}" > "$OUT/status.txt" 2>/dev/null
grep -v " pending " "$OUT/status.txt" | head -40
cp runs/campaign/gpu_run.log "$OUT/run.log"; cp runs/campaign/gpu_util.txt "$OUT/" 2>/dev/null
# every page the campaign (re-)rendered, and its after: steps' pages: what git sees changed under results/
tar czf "$OUT/evidence.tgz" results/runs $(git ls-files -m -o --exclude-standard results | grep -v '^results/runs/')
find runs -path runs/campaign -prune -o \( -name "*.log" -o -name "*.json" \) -size -5M -print 2>/dev/null \
  | tar czf "$OUT/runlogs.tgz" -T -
ls -la "$OUT"
