#!/usr/bin/env bash
# conveyor launch across emulated hosts: a coordinator host and two worker hosts (network
# namespaces on a bridge), workers started through the ssh command template pointed at a local
# stand-in (fake_ssh.sh), so the launcher's real ssh path runs; activations cross hosts over UCX on
# TCP; tokens through the RPC client equal the fixture's HF goldens; SIGTERM stops every process on
# every host, and so does the launcher's death (SIGKILL).
# usage: netns_launch_test.sh CONVEYOR FIXTURES_DIR TESTS_LAUNCH_DIR pp|pptp
set -u
bin=$1; fx=$2; here=$3; shape=$4
source "$here/netns_lib.sh"

make_coordinator_host
make_host 1 10.77.0.2
make_host 2 10.77.0.3
export FAKE_SSH_HOSTS="10.77.0.2=$id-1 10.77.0.3=$id-2"
tp=1; [ "$shape" = pptp ] && tp=2
write_deploy "$tmp/deploy.toml" alpha 10.77.0.2 beta 10.77.0.3 90 "$here/fake_ssh.sh {host} {command}" "tp = $tp"

start_launch "$tmp/deploy.toml"
addr=$(wait_listening)
if [ -z "$addr" ]; then
  echo "FAIL launch did not come up:"; cat "$tmp/out" "$tmp/err"; exit 1
fi
ok "launch_$shape"
grep -q "host alpha (10.77.0.2) stage 0: started" "$tmp/err" && grep -q "host beta (10.77.0.3) stage 1: started" "$tmp/err" \
  && grep -q "all 2 stages ready" "$tmp/err" && ok progress_per_host_and_stage || { bad "progress lines:"; cat "$tmp/err"; }

# Greedy tokens of tests/fixtures/tiny-llama/golden.json (prompts 1 and 2).
want1="371 119 801 572 692 735 572 698 641 53 1005 620 931 415 46 170 897 736 36 194 330 256 635 529"
got1=$(client generate --connect "$addr" --prompt-ids 989,229,186,822,100,504,324 --max-new-tokens 24 --ignore-eos --format text)
[ "$got1" = "$want1" ] && ok golden_prompt_1 || bad "golden prompt 1: $got1"
want2="583 713 856 610 91 417 982 756 957 362 615 417 677 35 496 362 615 111 1012 1011 85 173 194 528"
got2=$(client generate --connect "$addr" --prompt-ids 150,675,751,711,335,611,28,318,964,134,883,677,217,198,183,260,398,817,372,196,258,376,679,634,804,173,777,197,187,903,266,801,635 --max-new-tokens 24 --ignore-eos --format text)
[ "$got2" = "$want2" ] && ok golden_prompt_2 || bad "golden prompt 2: $got2"

# Each stage's worker runs on the host the placement names.
for h in 1 2; do
  stage=$((h - 1))
  if ip netns pids "$id-$h" | xargs -r -I{} cat /proc/{}/cmdline 2>/dev/null | tr '\0' ' ' | grep -q "worker --stage $stage "; then
    ok "stage_${stage}_runs_on_host_$h"
  else
    bad "no stage $stage worker in namespace $id-$h"
  fi
done
# The token is on no command line.
token_seen=0
for h in 1 2; do
  for p in $(ip netns pids "$id-$h"); do grep -q "CONVEYOR_CLUSTER_TOKEN" /proc/$p/cmdline 2>/dev/null && token_seen=1; done
done
[ $token_seen = 0 ] && ok token_not_on_command_lines || bad "token on a command line"

kill -TERM "$launch_pid"
wait_exit 30
[ "$rc" = 0 ] && ok stops_on_sigterm || bad "launch after SIGTERM: $rc"
sleep 0.5
if [ "$(left_in 1)" = 0 ] && [ "$(left_in 2)" = 0 ]; then ok no_process_left_on_any_host; else
  bad "processes left: host 1: $(left_in 1), host 2: $(left_in 2)"; fi

# A launcher that dies without stopping anything (SIGKILL): the workers stop on their own, on every
# host (the coordinator's actor goes down, and their stdin, which ssh would forward, closes).
if [ "$shape" = pp ]; then
  start_launch "$tmp/deploy.toml"
  if [ -n "$(wait_listening)" ]; then
    kill -KILL "$launch_pid"
    wait "$launch_pid" 2>/dev/null
    launch_pid=
    for _ in $(seq 1 100); do [ "$(left_in 1)" = 0 ] && [ "$(left_in 2)" = 0 ] && break; sleep 0.1; done
    if [ "$(left_in 1)" = 0 ] && [ "$(left_in 2)" = 0 ]; then ok workers_stop_when_the_launcher_dies; else
      bad "after SIGKILL of launch: host 1: $(left_in 1), host 2: $(left_in 2) processes left"; fi
  else
    bad "second launch did not come up"
  fi
fi
[ $fail = 0 ] || { echo "--- launch stderr"; cat "$tmp/err"; }
exit $fail
