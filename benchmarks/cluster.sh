#!/usr/bin/env bash
# Cluster recipe: one rank per core across the hosts of a hostfile, with the cluster's MPI.
#   make setup MPI=system          # mpi4py built against the cluster's mpicc (Open MPI, MPICH, ...)
#   printf 'node1 slots=8\nnode2 slots=8\n' > hosts
#   NP=16 HOSTFILE=hosts bash benchmarks/cluster.sh
# Under Slurm: srun -n 16 .venv/bin/python -m ringmpi bench --out results/cluster-p16
# The .venv must be at the same path on every host (a shared file system).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-16}
HOSTFILE=${HOSTFILE:-hosts}
PY=$(pwd)/.venv/bin/python
$PY -m ringmpi.launch -n "$NP" --timeout 3600 --mpi-args "--hostfile $HOSTFILE" -- \
  $PY -m ringmpi bench -b 1K -e 256M -f 4 --out "results/cluster-p$NP"
