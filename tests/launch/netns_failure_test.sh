#!/usr/bin/env bash
# conveyor launch when a host does not come up: the failure names the host and stage, comes within
# serving.startup_timeout_s (at once when the launch command itself fails), and leaves no process
# behind on any host.
#   unreachable  - ssh (the stand-in) cannot reach the second host's address
#   no_namespace - the template `ip netns exec {name} sh -c {command}` names a host that does not exist
#   timeout      - the host exists but has no link to the coordinator: its worker never joins
#   interrupted  - SIGINT while waiting for that host: launch stops at once, everywhere
# usage: netns_failure_test.sh CONVEYOR FIXTURES_DIR TESTS_LAUNCH_DIR
set -u
bin=$1; fx=$2; here=$3
source "$here/netns_lib.sh"

make_coordinator_host
make_host 1 10.77.0.2
make_isolated_host 3 10.77.0.30

# config NAME2 ADDRESS2 TEMPLATE TIMEOUT: stage 0 on the good host, stage 1 on the given one.
config() {
  write_deploy "$tmp/deploy.toml" "$id-1" 10.77.0.2 "$1" "$2" "$4" "$3"
}

# expect_failure CASE SECONDS PATTERN...: launch must end non-zero within SECONDS, stderr matching
# every PATTERN, and nothing may be left running on the worker hosts.
expect_failure() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  start_launch "$tmp/deploy.toml"
  wait_exit "$limit"
  local took=$((SECONDS - t0))
  if [ "$rc" = running ] || [ "$rc" = 0 ]; then
    bad "$name: launch did not fail within $limit s (rc $rc)"; cat "$tmp/err"; return
  fi
  for pattern in "$@"; do
    grep -q -- "$pattern" "$tmp/err" || { bad "$name: stderr lacks \"$pattern\":"; cat "$tmp/err"; return; }
  done
  sleep 0.3
  if [ "$(left_in 1)" != 0 ] || [ "$(left_in 3)" != 0 ]; then bad "$name: processes left behind"; return; fi
  ok "$name (failed after ${took} s)"
  [ -n "${VERBOSE:-}" ] && cat "$tmp/err"
}

export FAKE_SSH_HOSTS="10.77.0.2=$id-1 10.77.0.30=$id-3"
config ghost 10.77.0.99 "$here/fake_ssh.sh {host} {command}" 60
expect_failure unreachable_host_is_named 20 \
  "host ghost (10.77.0.99) stage 1: the worker's process exited with status 255 before it joined"

config "$id-9" 10.77.0.40 "ip netns exec {name} sh -c {command}" 60
expect_failure missing_namespace_is_named 20 \
  "host $id-9 (10.77.0.40) stage 1: the worker's process exited with status" "Cannot open network namespace"

config "$id-3" 10.77.0.30 "ip netns exec {name} sh -c {command}" 4
expect_failure startup_timeout_names_the_host 15 \
  "host $id-3 (10.77.0.30) stage 1"
grep -q "did not come up within 4 s\|exited with status 1 before it joined" "$tmp/err" \
  && ok timeout_reason_given || bad "timeout reason: $(cat "$tmp/err")"

# A stop signal during a long start-up ends it at once, and stops what was started on every host.
config "$id-3" 10.77.0.30 "ip netns exec {name} sh -c {command}" 120
start_launch "$tmp/deploy.toml"
for _ in $(seq 1 100); do grep -q "stage 1: started" "$tmp/err" && break; sleep 0.1; done
sleep 0.5
kill -INT "$launch_pid"
wait_exit 15
sleep 0.3
if [ "$rc" != running ] && [ "$rc" != 0 ] && grep -q "start-up interrupted" "$tmp/err" && [ "$(left_in 1)" = 0 ] &&
   [ "$(left_in 3)" = 0 ]; then
  ok interrupted_startup_stops_everything
else
  bad "interrupted start-up: rc $rc, left $(left_in 1)/$(left_in 3): $(cat "$tmp/err")"
fi
exit $fail
