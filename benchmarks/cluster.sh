#!/usr/bin/env bash
# Cluster recipe: one rank per core across the hosts, with the cluster's MPI.
#   make setup MPI=system          # mpi4py built against the cluster's mpicc (Open MPI, MPICH, ...)
#   NP=16 HOSTS=node1:8,node2:8 bash benchmarks/cluster.sh
#   (or HOSTFILE=hosts in the launcher's own format: Open MPI "node1 slots=8", MPICH "node1:8")
# Under Slurm: srun -n 16 .venv/bin/python -m ringmpi bench --out results/cluster-p16
# The .venv must be at the same path on every host (a shared file system).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-16}
PY=$(pwd)/.venv/bin/python
WHERE=(--hosts "${HOSTS:-}")
[ -n "${HOSTFILE:-}" ] && WHERE=(--mpi-args "--hostfile $HOSTFILE")
$PY -m ringmpi.launch -n "$NP" --timeout 3600 "${WHERE[@]}" -- \
  $PY -m ringmpi bench -b 1K -e 256M -f 4 --out "results/cluster-p$NP"
