#!/usr/bin/env bash
# The standard laptop sweeps (2 and 4 ranks on one machine). Writes benchmarks/results/.
# Usage: bash benchmarks/laptop.sh   (after `make setup`; uses .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results}
run() { local np=$1; shift; $PY -m ringmpi.launch -n "$np" --timeout 1800 -- $PY -m ringmpi bench --no-progress "$@"; }
# 1. all-reduce, 2 ranks, 1 KiB .. 64 MiB in steps of 2: ring vs MPI_Allreduce, auto vs the fastest
run 2 -C allreduce -b 1K -e 64M -f 2 --rounds 7 --out "$OUT/p2-allreduce" | tee "$OUT/p2-allreduce.txt"
# 2. every collective, 2 and 4 ranks, 1 KiB .. 16 MiB in steps of 4
run 2 -b 1K -e 16M -f 4 --out "$OUT/p2-all" | tee "$OUT/p2-all.txt"
run 4 -b 1K -e 16M -f 4 --out "$OUT/p4-all" | tee "$OUT/p4-all.txt"
# 3. shared memory on one host, 2 ranks: ring_shm vs the point-to-point ring vs MPI_Allreduce,
#    on ordinary arrays (-R 0) and on buffers in shared memory (-R 1, ringmpi.shared_empty)
for R in 0 1; do
  run 2 -C allreduce -A ring,ring_shm -b 256K -e 64M -f 4 --rounds 7 -R $R --out "$OUT/shm-p2-R$R" | tee "$OUT/shm-p2-R$R.txt"
done
# 4. a machine with no profile: auto tuning itself online, and the per-call overhead
run 2 -C allreduce,reduce_scatter,allgather,broadcast -b 8 -e 64M -f 8 --rounds 5 --fresh --out "$OUT/fresh-p2" | tee "$OUT/fresh-p2.txt"
