#!/usr/bin/env bash
# Stage-failure recovery across hosts: conveyor launch over two emulated hosts (network namespaces,
# workers started through the ssh template), a request streaming, then kill -9 of the worker on the
# second host. The coordinator restarts that stage there (through the ssh template again), the
# first host's worker reconnects to the new one, and the request ends with the golden tokens.
# Also: every worker's sockets listen on its host's configured address only.
# usage: netns_recovery_test.sh CONVEYOR FIXTURES_DIR TESTS_LAUNCH_DIR
set -u
bin=$1; fx=$2; here=$3
source "$here/netns_lib.sh"

make_coordinator_host
make_host 1 10.77.0.2
make_host 2 10.77.0.3
export FAKE_SSH_HOSTS="10.77.0.2=$id-1 10.77.0.3=$id-2"
write_deploy "$tmp/deploy.toml" alpha 10.77.0.2 beta 10.77.0.3 90 "$here/fake_ssh.sh {host} {command}" "" "recover_stages = true"

start_launch "$tmp/deploy.toml"
addr=$(wait_listening)
[ -n "$addr" ] || { echo "FAIL launch did not come up:"; cat "$tmp/out" "$tmp/err"; exit 1; }

# The worker process of a host (not the shell or fake ssh that started it).
real_bin=$(readlink -f "$bin")
worker_pid() {
  for p in $(ip netns pids "$id-$1"); do
    [ "$(readlink -f /proc/$p/exe 2>/dev/null)" = "$real_bin" ] && { echo "$p"; return; }
  done
}

# Every listening socket of each worker is on its host's address (UCX's tcp listeners included).
for h in 1 2; do
  want=10.77.0.$((h + 1))
  pid=$(worker_pid $h)
  ip netns exec "$id-$h" ss -H -l -t -u -n -p | grep "pid=$pid," >"$tmp/ss$h"
  beyond=$(awk -v want="$want" '{ host = $5; sub(/:[^:]*$/, "", host); if (host != want) print }' "$tmp/ss$h")
  [ -n "${VERBOSE:-}" ] && cat "$tmp/ss$h"
  if [ -s "$tmp/ss$h" ] && [ -z "$beyond" ]; then ok "host_${h}_worker_listens_on_${want}_only"; else
    bad "host $h worker listens beyond $want:"; cat "$tmp/ss$h"; fi
done

# A long greedy request; first without a fault (the reference), then kill -9 of the second host's
# worker while it runs: the tokens must not change.
ids=989,229,186,822,100,504,324
gen() { client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 480 --ignore-eos --format text; }
t0=$(date +%s.%N)
reference=$(gen)
took=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$(wc -w <<<"$reference")" = 480 ] || bad "reference run: $reference"
gen >"$tmp/gen" 2>"$tmp/gen.err" &
gen_pid=$!
sleep "$(echo "$took / 4" | bc -l)"
old=$(worker_pid 2)
kill -KILL "$old"
t0=$(date +%s.%N)
for _ in $(seq 1 500); do grep -q "restarting it" "$tmp/err" && break; sleep 0.01; done
noticed=$(echo "$(date +%s.%N) - $t0" | bc)
if grep -q "stage 1 worker (pid .*) exited.*restarting it (1 of at most 3)" "$tmp/err" && [ "$(echo "$noticed < 2" | bc)" = 1 ]; then
  ok "dead_stage_noticed_in_${noticed}_s"
else
  bad "dead stage not noticed within 2 s ($noticed s):"; cat "$tmp/err"
fi
# The request was still running when the fault was noticed, so it really crossed the restart.
kill -0 "$gen_pid" 2>/dev/null && ok "request_spans_the_restart (a run takes ${took} s)" \
  || bad "the request ended before the fault was noticed (${took} s a run): the test proves nothing"
wait "$gen_pid"
got=$(cat "$tmp/gen")
[ "$got" = "$reference" ] && ok request_across_the_restart_gives_the_same_tokens || { bad "tokens differ: $got"; cat "$tmp/gen.err"; }
new=$(worker_pid 2)
[ -n "$new" ] && [ "$new" != "$old" ] && ok stage_1_restarted_on_host_2 || bad "no new stage 1 worker on host 2 ($old -> $new)"
grep -q "host beta (10.77.0.3) stage 1: restarted" "$tmp/err" && grep -q "stage 1 is back" "$tmp/err" \
  && ok restart_reported || { bad "restart lines:"; cat "$tmp/err"; }
health=$(client health --connect "$addr")
grep -q '"ready":true' <<<"$health" && ok ready_again || bad "health after the restart: $health"
want="371 119 801 572 692 735 572 698 641 53 1005 620 931 415 46 170 897 736 36 194 330 256 635 529"
got2=$(client generate --connect "$addr" --prompt-ids $ids --max-new-tokens 24 --ignore-eos --format text)
[ "$got2" = "$want" ] && ok serves_golden_tokens_after_the_restart || bad "after the restart: $got2"

kill -TERM "$launch_pid"
wait_exit 30
sleep 0.5
[ "$(left_in 1)" = 0 ] && [ "$(left_in 2)" = 0 ] && ok no_process_left || bad "processes left: $(left_in 1) / $(left_in 2)"
# `conveyor serve` on one host whose coordinator listens on a non-loopback address: its workers'
# listeners are on that address too, not on every interface (lo included).
cat >"$tmp/serve.toml" <<TOML
[cluster]
listen = "10.77.0.1:0"
[frontend]
rpc_listen = "10.77.0.1:0"
[transport]
ucx_tls = "tcp"
TOML
ip netns exec "$coord" "$bin" serve --config "$tmp/serve.toml" --model "$fx/tiny-llama" --stages 2 >"$tmp/out" 2>"$tmp/err" &
launch_pid=$!
if [ -n "$(wait_listening)" ]; then
  workers=$(ps -o pid= --ppid "$launch_pid" | tr -d ' ')
  ip netns exec "$coord" ss -H -l -t -u -n -p >"$tmp/ss"
  : >"$tmp/mine"
  for p in $workers; do grep "pid=$p," "$tmp/ss" >>"$tmp/mine"; done
  [ -n "${VERBOSE:-}" ] && cat "$tmp/mine"
  beyond=$(awk '{ host = $5; sub(/:[^:]*$/, "", host); if (host != "10.77.0.1") print }' "$tmp/mine")
  if [ "$(wc -w <<<"$workers")" = 2 ] && [ -s "$tmp/mine" ] && [ -z "$beyond" ]; then ok serve_workers_listen_on_the_cluster_address_only
  else bad "serve workers ($workers) listen beyond 10.77.0.1:"; cat "$tmp/mine"; fi
else
  bad "serve did not come up:"; cat "$tmp/err"
fi
kill -TERM "$launch_pid"; wait_exit 30

[ $fail = 0 ] || { echo "--- launch stderr"; cat "$tmp/err"; }
exit $fail
