# Helpers for the multi-host launch tests (sourced). Hosts are network namespaces joined by veth
# links to a bridge in the coordinator's namespace, on 10.77.0.0/24: the only addresses used are the
# ones made here, inside namespaces made here. Everything is removed on exit, also on failure.
# Needs: bin, fx, here set by the caller.

id=cvy$$                 # unique per run: concurrent runs never share a name
coord=$id-c              # the coordinator's host (10.77.0.1, on the bridge)
namespaces=()
tmp=$(mktemp -d)
fail=0
launch_pid=

cleanup() {
  [ -n "$launch_pid" ] && kill -KILL "$launch_pid" 2>/dev/null
  for ns in "${namespaces[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

# make_coordinator_host: the coordinator's namespace with the bridge; skips the test (exit 77) when
# namespaces cannot be made here (not root, or no CAP_SYS_ADMIN in a container).
make_coordinator_host() {
  if ! ip netns add "$coord" 2>"$tmp/netns.err"; then
    echo "SKIP: cannot create network namespaces ($(cat "$tmp/netns.err")); these tests need root"
    exit 77
  fi
  namespaces+=("$coord")
  ip -n "$coord" link set lo up
  ip -n "$coord" link add br0 type bridge
  ip -n "$coord" addr add 10.77.0.1/24 dev br0
  ip -n "$coord" link set br0 up
}

# make_host N ADDRESS: namespace $id-N joined to the bridge, eth0 = ADDRESS/24.
make_host() {
  local ns=$id-$1
  ip netns add "$ns" || { bad "ip netns add $ns"; exit 1; }
  namespaces+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$coord" link add "v$1" type veth peer name eth0 netns "$ns"
  ip -n "$coord" link set "v$1" master br0 up
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth0 up
}

# make_isolated_host N ADDRESS: a namespace that holds ADDRESS but has no link to anyone.
make_isolated_host() {
  local ns=$id-$1
  ip netns add "$ns" || { bad "ip netns add $ns"; exit 1; }
  namespaces+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$ns" link add eth0 type veth peer name eth1   # both ends here: a link to nowhere
  ip -n "$ns" addr add "$2/24" dev eth0
  ip -n "$ns" link set eth1 up
  ip -n "$ns" link set eth0 up
}

# start_launch CONFIG: `conveyor launch CONFIG` in the coordinator's namespace, in the background.
start_launch() {
  ip netns exec "$coord" "$bin" launch "$1" >"$tmp/out" 2>"$tmp/err" &
  launch_pid=$!
}

# wait_listening: the RPC address once launch serves, or "" if it ended or took over 120 s.
wait_listening() {
  for _ in $(seq 1 1200); do
    if grep -q "listening on" "$tmp/out"; then
      sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out"
      return
    fi
    kill -0 "$launch_pid" 2>/dev/null || return
    sleep 0.1
  done
}

# wait_exit SECONDS: waits for launch to end; sets rc to its exit code, or "running".
wait_exit() {
  rc=running
  for _ in $(seq 1 $(($1 * 10))); do
    if ! kill -0 "$launch_pid" 2>/dev/null; then
      wait "$launch_pid"
      rc=$?
      launch_pid=
      return
    fi
    sleep 0.1
  done
}

client() { ip netns exec "$coord" "$bin" client "$@"; }

# Processes left in a host's namespace (the worker, or what started it).
left_in() { ip netns pids "$id-$1" 2>/dev/null | wc -l; }

# write_deploy FILE NAME1 ADDRESS1 NAME2 ADDRESS2 STARTUP_TIMEOUT_S SSH_TEMPLATE [PARALLEL_LINES] [CLUSTER_LINES]:
# the two-host deployment every netns test starts from (tiny-llama, 2 stages, UCX over tcp,
# coordinator and RPC on the bridge address, workers started through the ssh template); the optional
# lines go under [parallel] and [cluster].
write_deploy() {
  cat >"$1" <<TOML
[model]
dir = "$fx/tiny-llama"
[parallel]
stages = 2
${8:-}
[[placement.hosts]]
name = "$2"
address = "$3"
[[placement.hosts]]
name = "$4"
address = "$5"
[transport]
ucx_tls = "tcp"
[cluster]
listen = "10.77.0.1:0"
${9:-}
[frontend]
rpc_listen = "10.77.0.1:0"
[serving]
kv_blocks = 64
startup_timeout_s = $6
[launch]
method = "ssh"
ssh_command = "$7"
TOML
}
