#!/usr/bin/env bash
# conveyor launch with launch.method = "slurm": one srun step (a local stand-in, fake_srun.sh, that
# gives each task the SLURM_* variables srun would) brings up both stages, each taking its stage from
# SLURM_PROCID; golden tokens through the RPC client; SIGTERM stops the step. Then `worker --slurm`
# on its own: a task whose placement names another machine, and a step of the wrong size; and a
# worker whose token came on stdin stopping when stdin closes.
# usage: slurm_launch_test.sh CONVEYOR FIXTURES_DIR TESTS_LAUNCH_DIR
set -u
bin=$1; fx=$2; here=$3
fail=0
tmp=$(mktemp -d)
launch_pid=
trap '[ -n "$launch_pid" ] && kill -KILL $launch_pid 2>/dev/null; rm -rf "$tmp"' EXIT
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

cat >"$tmp/deploy.toml" <<TOML
[model]
dir = "$fx/tiny-llama"
[parallel]
stages = 2
[transport]
ucx_tls = "tcp"
[frontend]
rpc_listen = "127.0.0.1:0"
[serving]
kv_blocks = 64
startup_timeout_s = 60
[launch]
method = "slurm"
srun_command = "$here/fake_srun.sh --mpi=none"
TOML
"$bin" launch "$tmp/deploy.toml" >"$tmp/out" 2>"$tmp/err" &
launch_pid=$!
for _ in $(seq 1 600); do grep -q "listening on" "$tmp/out" && break; kill -0 $launch_pid 2>/dev/null || break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out")
[ -n "$addr" ] || { echo "FAIL slurm launch did not come up:"; cat "$tmp/out" "$tmp/err"; exit 1; }
ok slurm_launch
grep -q "the srun step (2 tasks on 1 node): started" "$tmp/err" && ok progress_names_the_step || bad "progress: $(cat "$tmp/err")"
want="371 119 801 572 692 735 572 698 641 53 1005 620 931 415 46 170 897 736 36 194 330 256 635 529"
got=$("$bin" client generate --connect "$addr" --prompt-ids 989,229,186,822,100,504,324 --max-new-tokens 24 --ignore-eos --format text)
[ "$got" = "$want" ] && ok golden_through_slurm_workers || bad "golden: $got"
pg=$(ps -o pgid= -p "$(pgrep -f "fake_srun.sh" -P $launch_pid | head -1)" 2>/dev/null | tr -d ' ')
kill -TERM $launch_pid
for _ in $(seq 1 300); do kill -0 $launch_pid 2>/dev/null || break; sleep 0.1; done
if kill -0 $launch_pid 2>/dev/null; then bad "launch still running after SIGTERM"; else ok stops_on_sigterm; launch_pid=; fi
sleep 0.3
left=$([ -n "$pg" ] && pgrep -g "$pg")
if [ -n "$left" ]; then bad "srun step processes left (group $pg): $left"; else ok no_task_left; fi

# One task on its own, placed on an address this machine does not have (10.77.0.200: never used,
# only compared with the machine's own addresses).
out=$(SLURM_PROCID=1 SLURM_NTASKS=2 SLURMD_NODENAME=node7 CONVEYOR_CLUSTER_TOKEN=t "$bin" worker --slurm \
  --placement "a@127.0.0.1;b@10.77.0.200" --coordinator 127.0.0.1:9 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "SLURM_PROCID 1 runs on node node7, but the placement puts stage 1 on host b: address 10.77.0.200 is not an address of this machine" <<<"$out"; then
  ok task_on_the_wrong_node
else
  bad "wrong node: rc=$rc $out"
fi
out=$(SLURM_PROCID=0 SLURM_NTASKS=3 CONVEYOR_CLUSTER_TOKEN=t "$bin" worker --slurm --placement "a@127.0.0.1;b@127.0.0.1" \
  --coordinator 127.0.0.1:9 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "SLURM_NTASKS=3 tasks but the placement has 2 stages" <<<"$out"; then ok step_of_the_wrong_size; else bad "ntasks: rc=$rc $out"; fi
out=$(CONVEYOR_CLUSTER_TOKEN=t "$bin" worker --slurm --placement "a@127.0.0.1" --coordinator 127.0.0.1:9 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "SLURM_PROCID is not set" <<<"$out"; then ok not_under_srun; else bad "no procid: rc=$rc $out"; fi
# The token on stdin (the ssh path): the worker stops as soon as stdin closes, even while it is
# still trying to reach a coordinator (nothing listens on 127.0.0.1:9).
out=$( (echo tok; sleep 0.5) | timeout 20 "$bin" worker --token-stdin --stage 0 --coordinator 127.0.0.1:9 --join-timeout 30 2>&1); rc=$?
if [ $rc = 3 ] && grep -q "stdin closed (the launcher went away); stopping" <<<"$out"; then ok stdin_lifeline; else bad "stdin: rc=$rc $out"; fi
exit $fail
