#!/usr/bin/env bash
# Workers join only with the cluster token: `conveyor worker` with a wrong token (or none) is refused by
# a running `conveyor serve`, and the cluster keeps serving. The right token gets past the token check
# (it is then refused because every stage slot is taken), which shows the check is the token's.
# usage: worker_token_test.sh CONVEYOR_BINARY FIXTURES_DIR
set -u
bin=$1; fx=$2
fail=0
tmp=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$tmp"' EXIT
printf '[cluster]\ntoken = "s3cret-test-token"\n' >"$tmp/deploy.toml"
"$bin" serve --config "$tmp/deploy.toml" --model "$fx/tiny-llama" --stages 2 --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
server=$!
for _ in $(seq 1 600); do grep -q "listening on" "$tmp/out" && break; kill -0 $server 2>/dev/null || break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$tmp/out")
[ -n "$addr" ] || { echo "FAIL serve did not start:"; cat "$tmp/out" "$tmp/err"; exit 1; }
# The coordinator's CAF address is on the workers' command lines (the token is not: it travels in the
# environment, out of what `ps` shows).
worker=$(ps -o pid= --ppid $server | head -n 1 | tr -d ' ')
cmdline=$(tr '\0' ' ' </proc/$worker/cmdline)
coord=$(sed -n 's/.*--coordinator \([^ ]*\).*/\1/p' <<<"$cmdline")
[ -n "$coord" ] || { echo "FAIL no --coordinator on the worker's command line: $cmdline"; exit 1; }
if grep -q "s3cret-test-token" <<<"$cmdline"; then echo "FAIL the token is on a command line"; fail=1; else echo "ok   token_not_on_command_line"; fi

join() {  # join TOKEN STAGE: runs a worker against the cluster; its stderr in $tmp/join
  CONVEYOR_CLUSTER_TOKEN=$1 timeout 60 "$bin" worker --coordinator "$coord" --stage "$2" >/dev/null 2>"$tmp/join"
}
join wrong-token 0; rc=$?
# Refused means failed: exit status 1, so whoever started the worker (a launcher, srun) sees it.
if [ $rc = 1 ] && grep -q "join refused" "$tmp/join" && grep -q "bad cluster token" "$tmp/join"; then
  echo "ok   wrong_token_refused_exit_1"
else
  echo "FAIL wrong token: rc=$rc $(cat "$tmp/join")"; fail=1
fi
join wrong-token 7; rc=$?  # a slot that does not exist: the token is still what is checked first
if [ $rc = 1 ] && grep -q "bad cluster token" "$tmp/join"; then
  echo "ok   wrong_token_refused_before_slot_checks"
else
  echo "FAIL wrong token, stage 7: rc=$rc $(cat "$tmp/join")"; fail=1
fi
join "" 0; rc=$?
if [ $rc = 1 ] && grep -q "CONVEYOR_CLUSTER_TOKEN is not set" "$tmp/join"; then
  echo "ok   no_token_refused"
else
  echo "FAIL no token: rc=$rc $(cat "$tmp/join")"; fail=1
fi
join s3cret-test-token 0; rc=$?
if [ $rc = 1 ] && grep -q "already taken" "$tmp/join" && ! grep -q "bad cluster token" "$tmp/join"; then
  echo "ok   right_token_passes_the_token_check"
else
  echo "FAIL right token: rc=$rc $(cat "$tmp/join")"; fail=1
fi
# The refused workers changed nothing: both stages ready, and a request is served.
health=$("$bin" client health --connect "$addr")
if grep -q '"ready":true' <<<"$health" && [ "$(grep -o '"state":"ready"' <<<"$health" | wc -l)" = 2 ]; then
  echo "ok   cluster_still_ready"
else
  echo "FAIL health after refused joins: $health"; fail=1
fi
got=$("$bin" client generate --connect "$addr" --prompt-ids 989,229,186,822,100,504,324 --max-new-tokens 4 --ignore-eos --format text)
if [ "$got" = "371 119 801 572" ]; then echo "ok   still_serves_golden_tokens"; else echo "FAIL generate after refused joins: $got"; fail=1; fi
exit $fail
