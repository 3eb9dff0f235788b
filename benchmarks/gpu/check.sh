#!/usr/bin/env bash
# The prepared GPU check of issue 25 (item 8). See --help.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

usage() {
    cat <<'EOF'
Usage: bash benchmarks/gpu/check.sh --out DIR [options]

One command that checks paraplan on one GPU (under 9 minutes on an H100/H200) and writes
everything it measured under DIR:

  1. install   (only with --wheels) our dependencies from a wheel folder, then paraplan --no-deps
  2. env       versions, the GPU and its catalog name -> env.json
     sustained GEMMs in a burst and held at the power limit, bf16 and FP8, randn and zeros, on
               GPT-3 TP-4 and Llama-3-70B TP-8 shapes, with nvidia-smi's power and clock
               (benchmarks/gpu/sustained.py) -> profile/sustained_gemm.json
  3. tests     the GPU-marked tests (pytest -m gpu) -> tests.log, tests.xml
  4. jobs      the job files the steps below read -> small-llama.yaml, profile-job.yaml
  5. profile   `paraplan profile adaptive`: a Llama-3-8B layer's operators in bf16, for
               --profile-time -> profile/ops.samples (+ journal), profile/adaptive.json
  6. fp8       bf16 vs FP8 (torch._scaled_mm) on a Llama-3-8B layer's GEMMs -> profile/fp8_gemm.json
  7. trace     a small Llama trained on the GPU under torch.profiler (record_shapes=True)
               -> trace/rank0.json.gz, trace/timers.json
  8. summarize `paraplan trace summarize` -> trace-summary.json, trace-summary.txt
  9. calibrate `paraplan calibrate trace` -> calibrated-cluster.yaml, calibrate.txt
 10. validate  `paraplan validate trace`, on the catalog's cluster and on the calibrated one
               -> validate.json, validate-calibrated.json (+ .txt)
 11. manifest  manifest.json: versions, GPU, each step's seconds and exit status, the files

Each step has a time limit (timeout: 300 s; the profile --profile-time + 180 s). A step that
fails is recorded (manifest.json "failed") and the others still run; the exit
status is 1 if any failed. Everything printed also goes to DIR/check.log. DIR must not exist or
be empty: nothing is ever written over.

Options:
  --out DIR            where everything goes (required; must be new or empty)
  --device DEV         cuda (default), cuda:N, or cpu for a dry run
  --quick              tiny shapes, a 10 s profile, few iterations (the CPU dry run CI runs)
  --profile-time T     how long the operator profile may start batches (default 180s; quick 10s)
  --wheels DIR         first install the dependencies from this wheel folder (no network:
                       benchmarks/gpu/wheels.sh fills it), then paraplan itself with --no-deps
  --python PY          the Python to use (default: python3; the machine's, holding CUDA torch)
  -h, --help           this text

A GPU machine with no network, from the repository root:
  bash benchmarks/gpu/check.sh --wheels benchmarks/gpu/wheels --out "$OUT/gpucheck"
The CPU dry run:
  bash benchmarks/gpu/check.sh --device cpu --quick --out /tmp/gpucheck
EOF
}

die() { echo "check.sh: $*" >&2; exit 2; }

OUT_DIR="" DEVICE="cuda" QUICK=0 PROFILE_TIME="" WHEELS="" PY="python3"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || die "--out needs a directory"; OUT_DIR="$2"; shift 2 ;;
        --device) [[ $# -ge 2 ]] || die "--device needs cuda, cuda:N or cpu"; DEVICE="$2"; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --profile-time) [[ $# -ge 2 ]] || die "--profile-time needs a duration (180s, 4 min)"; PROFILE_TIME="$2"; shift 2 ;;
        --wheels) [[ $# -ge 2 ]] || die "--wheels needs a folder"; WHEELS="$2"; shift 2 ;;
        --python) [[ $# -ge 2 ]] || die "--python needs an interpreter"; PY="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[[ -n "$OUT_DIR" ]] || die "--out DIR is required (see --help)"
[[ "$DEVICE" =~ ^(cpu|cuda|cuda:[0-9]+)$ ]] || die "--device '$DEVICE': choose cuda, cuda:N or cpu"
command -v "$PY" >/dev/null 2>&1 || die "--python '$PY': not found"
if [[ -e "$OUT_DIR" ]]; then
    [[ -d "$OUT_DIR" ]] || die "--out '$OUT_DIR' exists and is not a directory"
    [[ -z "$(ls -A "$OUT_DIR")" ]] || die "--out '$OUT_DIR' exists and is not empty: give a new directory (nothing is written over)"
fi
if [[ -n "$WHEELS" ]]; then
    [[ -d "$WHEELS" ]] || die "--wheels '$WHEELS': no such folder (fill it with benchmarks/gpu/wheels.sh)"
    compgen -G "$WHEELS/*.whl" >/dev/null || die "--wheels '$WHEELS': holds no .whl file (run benchmarks/gpu/wheels.sh)"
    WHEELS="$(cd "$WHEELS" && pwd)"
fi
if [[ -z "$PROFILE_TIME" ]]; then
    if [[ $QUICK -eq 1 ]]; then PROFILE_TIME="10s"; else PROFILE_TIME="180s"; fi
fi
# --profile-time in seconds (for the step's time limit): a number and s, min or h
if [[ "$PROFILE_TIME" =~ ^([0-9]+)[[:space:]]*(s|sec|min|h)?$ ]]; then
    case "${BASH_REMATCH[2]}" in
        min) PROFILE_SECONDS=$((BASH_REMATCH[1] * 60)) ;;
        h) PROFILE_SECONDS=$((BASH_REMATCH[1] * 3600)) ;;
        *) PROFILE_SECONDS=${BASH_REMATCH[1]} ;;
    esac
else
    die "--profile-time '$PROFILE_TIME': a whole number of s, min or h (180s, 4 min)"
fi
QUICK_FLAG=()
[[ $QUICK -eq 1 ]] && QUICK_FLAG=(--quick)

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
mkdir -p "$OUT_DIR/profile"
exec > >(tee -a "$OUT_DIR/check.log") 2>&1
cd "$REPO"
export PYTHONUNBUFFERED=1 COLUMNS=80

STEPS="$OUT_DIR/steps.jsonl"
: >"$STEPS"
FAILED=()

# step NAME CMD...: run it, log it, time it, record its exit status; never stops the check.
step() {
    local name="$1"; shift
    echo
    echo "=== $name: $*"
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    "$@" || rc=$?
    t1=$(date +%s.%N)
    local seconds
    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "=== $name: exit $rc after ${seconds} s"
    printf '{"step": "%s", "rc": %d, "seconds": %s}\n' "$name" "$rc" "$seconds" >>"$STEPS"
    if [[ $rc -ne 0 ]]; then FAILED+=("$name"); fi
    return 0
}

paraplan() { timeout 300 "$PY" -m paraplan.cli "$@"; }
helper() { "$PY" "$HERE/gpucheck.py" "$@"; }

# 1. install: the core dependencies the machine lacks (pip keeps what it has), then paraplan
#    itself without dependencies, so the machine's CUDA torch stays as it is.
install() {
    local reqs=(pydantic PyYAML typer rich numpy ijson)
    "$PY" -m pip install --no-index --find-links "$WHEELS" --no-cache-dir "${reqs[@]}"
    "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir "$REPO"
}
if [[ -n "$WHEELS" ]]; then step install install; fi

# 2. env; the catalog name of the GPU files the profile's rows under it.
step env helper env --device "$DEVICE" --out "$OUT_DIR/env.json"
DEVICE_NAME="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["catalog_gpu"] or "")' \
               "$OUT_DIR/env.json" 2>/dev/null || true)"

# 2b. GEMMs in bursts and held at the power limit (issue 27): first, as the measurement that matters most.
step sustained "$PY" "$HERE/sustained.py" --device "$DEVICE" --out "$OUT_DIR/profile/sustained_gemm.json" "${QUICK_FLAG[@]}"

# 3. the GPU-marked tests (on the CPU they skip): the files that hold the marker.
gpu_tests() {
    local files
    mapfile -t files < <(grep -rl --include='test_*.py' 'pytest.mark.gpu' tests | sort)
    [[ ${#files[@]} -gt 0 ]] || { echo "no test carries pytest.mark.gpu"; return 1; }
    # JAX (the sharding test) would otherwise take 75 % of the GPU's memory as it starts
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 \
    "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs --junitxml "$OUT_DIR/tests.xml" "${files[@]}" \
        2>&1 | tee "$OUT_DIR/tests.log"
}
step tests gpu_tests

# 4. the job files: the traced small Llama, and the one the operator profile samples for.
step jobs helper jobs --device "$DEVICE" --out "$OUT_DIR" "${QUICK_FLAG[@]}"

# 5. the operator profile: the adaptive sampler over a Llama-3-8B layer's shapes (bf16), for
#    --profile-time; the dry run samples the small Llama's own shapes (fp32) on one core.
profile_ops() {
    local args=(--for "$OUT_DIR/profile-job.yaml" --device "$DEVICE" --max-time "$PROFILE_TIME"
                --out "$OUT_DIR/profile/ops.samples" --format json)
    if [[ "$DEVICE" == cpu ]]; then
        args+=(--dtype fp32 --device-name cpu-core --cluster examples/tiny-cpu/cluster.yaml)
    else
        [[ -n "$DEVICE_NAME" ]] || { echo "the GPU is not in paraplan's catalog (env.json catalog_gpu)"; return 1; }
        args+=(--dtype bf16 --device-name "$DEVICE_NAME")
        [[ $QUICK -eq 1 ]] || args+=(--grid "$HERE/llama-3-8b-layer.yaml")
    fi
    # the budget only stops new batches: the one in hand, and writing the samples, come after it
    timeout $((PROFILE_SECONDS + 180)) \
        "$PY" -m paraplan.cli profile adaptive "${args[@]}" >"$OUT_DIR/profile/adaptive.json" 2> >(tee "$OUT_DIR/profile/adaptive.log" >&2)
}
step profile profile_ops
step fp8 helper fp8 --device "$DEVICE" --out "$OUT_DIR/profile/fp8_gemm.json" "${QUICK_FLAG[@]}"

# 7. the training trace of the small Llama.
step trace timeout 300 "$PY" "$HERE/gpucheck.py" train --device "$DEVICE" --job "$OUT_DIR/small-llama.yaml" --out "$OUT_DIR/trace" "${QUICK_FLAG[@]}"

# 8-10. decode, calibrate from it, validate the prediction of the same job.
summarize() {
    paraplan trace summarize "$OUT_DIR/trace" --format json --output "$OUT_DIR/trace-summary.json"
    paraplan trace summarize "$OUT_DIR/trace" --output "$OUT_DIR/trace-summary.txt"
    cat "$OUT_DIR/trace-summary.txt"
}
step summarize summarize
calibrate() {
    paraplan calibrate trace "$OUT_DIR/trace" --job "$OUT_DIR/small-llama.yaml" \
        --out "$OUT_DIR/calibrated-cluster.yaml" 2>&1 | tee "$OUT_DIR/calibrate.txt"
}
step calibrate calibrate
validate() {
    local job="$OUT_DIR/small-llama.yaml" trace="$OUT_DIR/trace"
    paraplan validate trace "$job" "$trace" --format json >"$OUT_DIR/validate.json"
    paraplan validate trace "$job" "$trace" | tee "$OUT_DIR/validate.txt"
    paraplan validate trace "$job" "$trace" --cluster "$OUT_DIR/calibrated-cluster.yaml" --format json \
        >"$OUT_DIR/validate-calibrated.json"
    paraplan validate trace "$job" "$trace" --cluster "$OUT_DIR/calibrated-cluster.yaml" \
        | tee "$OUT_DIR/validate-calibrated.txt"
}
step validate validate

# 11. the manifest, then a look at what came out.
helper manifest --out "$OUT_DIR"
echo
if [[ ${#FAILED[@]} -gt 0 ]]; then
    echo "check.sh: steps failed: ${FAILED[*]} (see $OUT_DIR/check.log); the rest is in $OUT_DIR"
    exit 1
fi
helper verify --out "$OUT_DIR"
echo "check.sh: done in $("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["total_s"])' \
    "$OUT_DIR/manifest.json") s; everything is in $OUT_DIR (manifest.json lists it)"
