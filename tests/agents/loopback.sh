# Sourced by the agents tests: installs the pinned clients (npm needs the network), then runs
# the calling script again in a network namespace of its own with loopback only, where the kernel
# lets an unprivileged user make one; sets `clients` to the directory holding them.
#   . tests/agents/loopback.sh NAME SOURCE_DIR "$0" "$@"
agents_loopback() {
  local name=$1 src=$2
  shift 2
  if [ -z "${OFFGRAPH_AGENTS_CLIENTS:-}" ]; then
    local dir
    dir=$("$src/scripts/agent-clients.sh" | tail -1)
    if unshare -rn true 2>/dev/null; then
      exec env OFFGRAPH_AGENTS_CLIENTS="$dir" OFFGRAPH_AGENTS_NETNS=1 unshare -rn bash "$@"
    fi
    echo "$name: no network namespace here (unshare -rn refused): loopback by configuration only"
    export OFFGRAPH_AGENTS_CLIENTS=$dir
  fi
  if [ -n "${OFFGRAPH_AGENTS_NETNS:-}" ]; then
    ip link set lo up
    echo "$name: in a network namespace with loopback only"
  fi
  clients=$OFFGRAPH_AGENTS_CLIENTS
}
