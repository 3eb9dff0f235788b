#!/usr/bin/env bash
# Download the wheels benchmarks/gpu/check.sh --wheels installs on a GPU machine with no network.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: bash benchmarks/gpu/wheels.sh [DIR]

Download, with the network to the package registry this machine has, the wheels of paraplan's
dependencies that the GPU machine's Python lacks, for CPython 3.12 on manylinux x86_64, into DIR
(default benchmarks/gpu/wheels, which git ignores), with their own dependencies. The GPU
machine already holds torch (CUDA), numpy, pandas, pyarrow, scipy, scikit-learn, PyYAML, typer
and rich (see /work/.library/device/KINDS.md); it lacks pydantic and ijson. typer, rich and
PyYAML come too, small, in case its versions are older than ours. numpy, pandas, scipy and
pyarrow are left out (16-45 MB each; the 64 MiB a device call carries would not hold them):
pip keeps the machine's, which satisfy our bounds. Prints each wheel with its size, and the total.

Then:  bash benchmarks/gpu/check.sh --wheels DIR --out OUT
EOF
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${1:-$HERE/wheels}"
PY="${PYTHON:-python3}"
mkdir -p "$DIR"

# paraplan's core dependencies (pyproject.toml) and the traces extra's ijson, without numpy.
REQS=("pydantic>=2.6" "PyYAML>=6.0" "typer>=0.12" "rich>=13.0" "ijson>=3.2")
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --abi abi3 --abi none "${PLATFORMS[@]}" --dest "$DIR" "${REQS[@]}"

total=0
for whl in "$DIR"/*.whl; do
    size=$(stat -c %s "$whl")
    total=$((total + size))
    printf '%10d  %s\n' "$size" "$(basename "$whl")"
done
printf '%10d  total (%.1f MiB; a device call carries 64 MiB with the working tree)\n' "$total" \
    "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')"
