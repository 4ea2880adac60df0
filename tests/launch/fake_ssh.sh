#!/bin/sh
# A stand-in for ssh in the launch tests, so the launcher's real ssh path runs without an ssh daemon:
#   fake_ssh.sh HOST COMMAND...
# runs COMMAND as ssh would on HOST (its words joined by spaces, given to a shell, stdin forwarded)
# inside the network namespace that FAKE_SSH_HOSTS ("address=namespace ...") maps HOST to. An
# unknown HOST fails as ssh does for a host it cannot reach.
host=$1
shift
for pair in $FAKE_SSH_HOSTS; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" sh -c "$*"
  fi
done
echo "ssh: connect to host $host port 22: No route to host" >&2
exit 255
