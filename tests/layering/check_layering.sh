#!/usr/bin/env bash
# The dependency rule of DESIGN.md, checked on #include lines:
#   kernels      <- nothing of ours but base; no CAF, UCX, Cap'n Proto, toml++, JSON
#   engine       <- kernels only; no CAF, UCX, Cap'n Proto, toml++, transport
#   transport    <- never CAF, engine or toml++
#   CAF          only in coordinator/ and stage_worker/actor/
#   toml++       only in the config loader (coordinator/config/)
# usage: check_layering.sh SOURCE_ROOT   (exit 1 and one line per violation when broken)
set -u
root=${1:?usage: check_layering.sh SOURCE_ROOT}
cd "$root" || exit 2
status=0
forbid() {  # forbid DIR REGEX WHY
  local dir=$1 regex=$2 why=$3
  [ -d "$dir" ] || return 0
  local hits
  hits=$(grep -rnE --include='*.hpp' --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
    "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($regex)" "$dir" || true)
  if [ -n "$hits" ]; then
    while IFS= read -r line; do echo "layering violation ($why): $line"; done <<<"$hits"
    status=1
  fi
}
forbid kernels 'caf/|ucp/|ucs/|uct/|capnp/|kj/|toml\+\+/|nlohmann/|conveyor/engine/|conveyor/transport/' \
  'kernels depend on nothing of ours'
forbid base 'caf/|ucp/|capnp/|kj/|toml\+\+/|conveyor/(kernels|engine|transport)/' 'base depends on nothing'
forbid stage_worker/engine 'caf/|ucp/|ucs/|uct/|capnp/|kj/|toml\+\+/|conveyor/transport/' \
  'the engine depends only on kernels'
forbid transport 'caf/|toml\+\+/|conveyor/engine/' 'transport never links CAF or the engine'
forbid schemas 'caf/' 'schemas are plain Cap n Proto'
forbid tokenizer 'caf/|ucp/|ucs/|uct/|capnp/|kj/|toml\+\+/|conveyor/(kernels|engine|transport|service|scheduler|frontend|coordinator)/' \
  'the tokenizer depends on nothing of ours but base'
for dir in cli tests bench tools stage_worker/engine transport kernels; do
  forbid "$dir" 'caf/' 'only coordinator/ and stage_worker/actor/ use CAF'
done
# toml++ only in the config loader.
hits=$(grep -rlE --include='*.hpp' --include='*.cpp' '#[[:space:]]*include[[:space:]]*[<"]toml\+\+/' . 2>/dev/null \
  | grep -vE '^\./(coordinator/config/|build)' || true)
if [ -n "$hits" ]; then
  while IFS= read -r f; do echo "layering violation (only coordinator/config/ reads TOML): $f"; done <<<"$hits"
  status=1
fi
[ $status -eq 0 ] && echo "layering: ok"
exit $status
