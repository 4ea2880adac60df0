#!/usr/bin/env bash
# Every socket that `conveyor serve` and `conveyor serve-local` listen on is bound to loopback when the
# deployment says loopback (the default): the RPC frontend, the coordinator's CAF middleman port, and in
# each stage worker UCX's tcp listeners and anything else. Nothing is reachable from another machine.
# Inspects `ss -ltunp` for the server's pid and its workers' pids.
# usage: listen_loopback_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$2
fail=0
tmp=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# Waits for "listening on" in $tmp/out of the process $server; prints the address.
wait_listening() {
  for _ in $(seq 1 600); do
    grep -q "listening on" "$tmp/out" && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out"
}

# check NAME PID...: every listening tcp/udp socket of the pids is on 127.0.0.0/8 or ::1.
check() {
  local name=$1; shift
  local pattern
  pattern=$(printf 'pid=%s,|' "$@"); pattern=${pattern%|}
  ss -H -l -t -u -n -p >"$tmp/ss"
  grep -E "$pattern" "$tmp/ss" >"$tmp/mine"
  local n bad
  n=$(wc -l <"$tmp/mine")
  bad=$(awk '{ split($5, a, ":"); host = $5; sub(/:[^:]*$/, "", host);
               if (host !~ /^127\./ && host != "[::1]" && host != "::1") print }' "$tmp/mine")
  echo "$name: $n listening sockets"
  sed 's/^/    /' "$tmp/mine"
  if [ -n "$bad" ]; then
    echo "FAIL $name: listening beyond loopback:"; echo "$bad"; fail=1
  else
    echo "ok   ${name}_listens_on_loopback_only"
  fi
}

# A 2-stage cluster: the coordinator process and two worker processes.
"$bin" serve --model "$fx/tiny-llama" --stages 2 --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
server=$!
addr=$(wait_listening)
[ -n "$addr" ] || { echo "FAIL serve did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
workers=$(ps -o pid= --ppid "$server" | tr -d ' ' | tr '\n' ' ')
[ "$(wc -w <<<"$workers")" = 2 ] || { echo "FAIL expected 2 worker processes, got: $workers"; fail=1; }
check serve "$server" $workers
# The frontend and the coordinator's middleman both listen; the RPC port is the one printed.
if grep -E "pid=$server," "$tmp/ss" | awk '{print $5}' | grep -qx "$addr"; then
  echo "ok   rpc_port_is_the_printed_one"
else
  echo "FAIL the printed address $addr is not among the server's listeners"; fail=1
fi
if [ "$(grep -cE "pid=$server," "$tmp/ss")" -ge 2 ]; then
  echo "ok   coordinator_port_seen"
else
  echo "FAIL expected the RPC and the CAF middleman listeners in the server"; fail=1
fi
kill -TERM "$server"; wait "$server" 2>/dev/null; server=

# One process serving the whole model.
"$bin" serve-local --model "$fx/tiny-llama" --stages 2 --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
server=$!
addr=$(wait_listening)
[ -n "$addr" ] || { echo "FAIL serve-local did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
check serve_local "$server"
kill -TERM "$server"; wait "$server" 2>/dev/null; server=
exit $fail
