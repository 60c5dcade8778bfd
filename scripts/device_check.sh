#!/usr/bin/env bash
# One prepared check of a machine with a GPU, in under 8 minutes: the engine
# for its backend, the GPU tier's identity tests on the device, plain vs MTP
# (n_max 1-4 and adaptive) with every layer on the device, and autotune. It
# writes a short report (format: docs/benchmarks.md, "The device check").
#
#   scripts/device_check.sh [--backend cuda|vulkan] [--out DIR] [--wheel FILE | --venv DIR] [--size S]
#
#   --backend  the engine to use (default: cuda where nvidia-smi answers, else vulkan)
#   --out      where the report and the logs go (default: ./device-check, or $OUT when set)
#   --wheel    an engine wheel built elsewhere (a lent machine has no network and
#              no time to compile CUDA): installed instead of building
#   --venv     an environment that already has the engine and the test tools
#   --size     synthetic model size for the benchmarks (default bench; tiny for a dry run)
#
# Dry run on a machine without a GPU (lavapipe): MTP_STUDIO_SOFTWARE_GPU=1
# scripts/device_check.sh --backend vulkan --venv .venv-vulkan --size tiny. Every
# step has its own deadline; a step that fails or runs out of time is reported
# and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."

BACKEND=""
DEST=${OUT:-device-check}
WHEEL=""
VENV=""
SIZE=bench
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) BACKEND=$2; shift 2 ;;
    --out) DEST=$2; shift 2 ;;
    --wheel) WHEEL=$2; shift 2 ;;
    --venv) VENV=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    *) echo "usage: $0 [--backend cuda|vulkan] [--out DIR] [--wheel FILE | --venv DIR] [--size S]" >&2; exit 2 ;;
  esac
done
if [ -z "$BACKEND" ]; then
  if nvidia-smi >/dev/null 2>&1; then BACKEND=cuda; else BACKEND=vulkan; fi
fi
mkdir -p "$DEST"
REPORT="$DEST/report.md"
GIVEN_VENV=$VENV
VENV=${VENV:-.venv-$BACKEND}
PY="$VENV/bin/python"
export MTP_STUDIO_GPU_TIER=1 QT_QPA_PLATFORM=offscreen PYTHONUNBUFFERED=1
T0=$(date +%s)

{
  echo "# Device check — $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "backend: $BACKEND; machine: $(uname -m), $(nproc) cores"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo
  echo "| step | exit | seconds |"
  echo "|---|---|---|"
} > "$REPORT"

# step NAME SECONDS COMMAND...: run with a deadline, log to $DEST/NAME.log, add a report row
step() {
  local name=$1 limit=$2; shift 2
  local start rc
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$DEST/$name.log" 2>&1
  rc=$?
  [ "$rc" -eq 124 ] && rc="124 (over ${limit} s)"
  echo "| $name | $rc | $(( $(date +%s) - start )) |" >> "$REPORT"
  echo "device check: $name exit $rc"
}

if [ -n "$GIVEN_VENV" ]; then
  echo "| engine | given: $VENV | 0 |" >> "$REPORT"
elif [ -n "$WHEEL" ]; then
  step engine 240 bash -c "python3 -m venv $VENV && $PY -m pip install -q --no-deps --force-reinstall '$WHEEL' \
    && $PY -m pip install -q -e '.[test]'"
else
  step engine 300 env MTP_STUDIO_VENV="$VENV" MTP_STUDIO_BACKEND="$BACKEND" ./packaging/bootstrap.sh --test
fi
step hardware 30 "$VENV/bin/mtp-studio" hardware --json
step tier 120 "$PY" -m pytest tests/gpu -p no:cacheprovider -q
# plain vs MTP on the device: a model big enough that a decode is the device's work, not the host's
step bench 90 "$VENV/bin/mtp-studio" bench --arch qwen35 --size "$SIZE" --weights mixed --gpu-layers 999 \
  --n-max 1,2,3,4 --acceptance 0.7 --tokens 64 --repeats 2 --reference skip
# k verify rows against one: about flat on a GPU (the reason MTP pays there), linear on a CPU
step verify-cost 45 "$VENV/bin/mtp-studio" bench-policies verify-cost --arch qwen35 --sizes "$SIZE" --gpu-layers 999 \
  --repeats 1
# fixed depths 1-4 against adaptive depth, per prompt category
step adaptive 90 "$VENV/bin/mtp-studio" bench-policies categories --arch qwen35 --size "$SIZE" --gpu-layers 999 \
  --n-max 1,2,3,4 --prompts 3 --tokens 48 --repeats 1
step graph-reuse 45 "$VENV/bin/mtp-studio" bench-policies graph-reuse --arch qwen35 --size "$SIZE" --gpu-layers 999 \
  --n-max 1,3 --tokens 48
MODEL=$("$PY" -c "from engine.synth import HeadMap, SynthModel, SynthSpec; \
print(SynthModel(SynthSpec(arch='qwen35', size='$SIZE', weights='mixed', heads=(HeadMap('token', 0.7),))).path())" \
  2>/dev/null)
[ -n "$MODEL" ] && step autotune 90 "$VENV/bin/mtp-studio" autotune "$MODEL" --gpu-layers 999 --tokens 32 \
  --prompts 3 --no-save

{
  echo
  echo "total: $(( $(date +%s) - T0 )) s"
  for name in tier bench verify-cost adaptive graph-reuse autotune; do
    [ -f "$DEST/$name.log" ] || continue
    echo
    echo "## $name (last lines)"
    echo
    echo '```'
    tail -n 25 "$DEST/$name.log"
    echo '```'
  done
} >> "$REPORT"
echo "device check: report in $REPORT"
