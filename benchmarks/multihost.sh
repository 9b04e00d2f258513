#!/usr/bin/env bash
# A real multi-host run on one Linux machine: every host a network namespace (its own
# hostname and IP, joined by veth pairs on a bridge), so MPI sees several hosts and every
# byte between hosts crosses TCP, as on a cluster. Needs root, iproute2 and unshare; Open MPI
# (the wheel).
#   sudo bash benchmarks/multihost.sh [N=4 | HOSTSxRANKS, e.g. 2x2] [-- ringmpi bench arguments]
# N: N hosts of one rank; 2x2: two hosts of two ranks (consecutive ranks on a host, shared
# memory between them). It creates namespaces rmh0.. (10.77.0.1../24, bridge rmbr0 at
# 10.77.0.254) and removes them, the bridge and its /etc/hosts lines on exit. RUN_CMD
# replaces the benchmark (e.g. RUN_CMD="$PWD/.venv/bin/python -m mpi4py -m pytest tests/mpi"),
# EXTRA_MPI_ARGS adds launcher flags, and RATE=1gbit shapes every host's egress with an HTB
# class at that rate (tc), as a 1 Gbit/s NIC, its queue LEAF (default "pfifo limit 10000": no drops;
# e.g. LEAF="pfifo limit 1000", a NIC's default length); SYSCTL="key=value ..." sets kernel settings in every
# host (e.g. net.ipv4.tcp_slow_start_after_idle=0). Exit status 3: namespaces cannot be made here.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYOUT=${1:-4}; shift || true
[ "${1:-}" = "--" ] && shift
case "$LAYOUT" in
  *x*) HOSTS=${LAYOUT%x*}; PER=${LAYOUT#*x} ;;
  *) HOSTS=$LAYOUT; PER=1 ;;
esac
N=$((HOSTS * PER))
TAG=$([ "$PER" -gt 1 ] && echo "${HOSTS}x$PER" || echo "p$N")
ARGS=("$@"); [ ${#ARGS[@]} -eq 0 ] && ARGS=(-C allreduce,broadcast -b 1K -e 16M -f 4 --out "benchmarks/results/multihost-$TAG")
if [ "$(id -u)" != 0 ] || ! ip netns add rmhprobe 2>/dev/null; then
  echo "multihost: network namespaces cannot be made here (needs root and iproute2); skipped" >&2
  exit 3
fi
ip netns del rmhprobe
PY=${PY:-$(pwd)/.venv/bin/python}   # (PY=$PWD/.venv-torch/bin/python: the venv with torch)
MPIRUN=$(dirname "$PY")/mpirun
WORK=
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cleanup() {
  for i in $(seq 0 $((HOSTS - 1))); do ip netns del "rmh$i" 2>/dev/null || true; ip link del "vrmh$i" 2>/dev/null || true; done
  ip link del rmbr0 2>/dev/null || true
  sed -i '/# ringmpi-multihost$/d' /etc/hosts
  [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
cleanup
WORK=$(mktemp -d)
ip link add rmbr0 type bridge
ip addr add 10.77.0.254/24 dev rmbr0
ip link set rmbr0 up
for i in $(seq 0 $((HOSTS - 1))); do
  h=rmh$i
  ip netns add $h
  ip link add "v$h" type veth peer name eth0 netns $h
  ip link set "v$h" master rmbr0 up
  ip netns exec $h ip addr add 10.77.0.$((i + 1))/24 dev eth0
  ip netns exec $h ip link set eth0 up
  ip netns exec $h ip link set lo up
  if [ -n "${RATE:-}" ]; then
    ip netns exec $h tc qdisc add dev eth0 root handle 1: htb default 10 r2q 1000
    ip netns exec $h tc class add dev eth0 parent 1: classid 1:10 htb rate "$RATE" ceil "$RATE"
    ip netns exec $h tc qdisc add dev eth0 parent 1:10 handle 10: ${LEAF:-pfifo limit 10000}  # deep: no drops
  fi
  for kv in ${SYSCTL:-}; do ip netns exec $h sysctl -q -w "$kv"; done   # e.g. SYSCTL=net.ipv4.tcp_slow_start_after_idle=0
  echo "10.77.0.$((i + 1)) $h # ringmpi-multihost" >> /etc/hosts
  echo "$h slots=$PER" >> "$WORK/hosts"
done
# Open MPI starts its daemons through an "ssh agent": this one drops ssh's options and
# runs the command inside the host's namespace, with its own hostname (UTS namespace).
cat > "$WORK/agent" <<'AGENT'
#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;   # options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; exec sh -c \"\$0\"" "$*"
AGENT
chmod +x "$WORK/agent"
NET=10.77.0.0/24
"$PY" -m ringmpi.launch -n "$N" --timeout 1800 --mpi-args "--hostfile $WORK/hosts \
  --prtemca plm_ssh_agent $WORK/agent --prtemca plm_ssh_no_tree_spawn 1 \
  --prtemca oob_tcp_if_include $NET --mca oob_tcp_if_include $NET \
  --mca pml ob1 --mca btl tcp,sm,self --mca btl_tcp_if_include $NET --mca mpi_yield_when_idle 1 --map-by slot \
  ${EXTRA_MPI_ARGS:-}" \
  -- ${RUN_CMD:-"$PY" -m ringmpi bench "${ARGS[@]}"}
