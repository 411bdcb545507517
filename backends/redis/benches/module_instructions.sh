#!/usr/bin/env bash
# Instructions per call (callgrind's Ir, redis-server's whole work: the
# network, the command, the module) of one TOLLGATE.DECIDE workload, on a
# throwaway redis-server run under valgrind. Deterministic where Redis CPU
# time is not, so a before/after of the module shows changes of a few
# percent that usec_per_call's noise hides. Needs valgrind.
#
#   MODULE=/path/to/libtollgate_redis_module.so \
#     backends/redis/benches/module_instructions.sh NAME COMMAND ARGS...
#   e.g. … token_bucket TOLLGATE.DECIDE 1 't:{__rand_int__}' '' '' 1 1 1000000 1000000 1000000
#
# Prints "NAME <instructions per call>" (N=20000 calls, after WARM=2000 to warm
# up; WARM=60000 first visits every one of the 10,000 keys, so that a workload
# whose states live on measures decisions on existing keys).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
NAME=$1; shift
PORT="${PORT:-6395}" N="${N:-20000}" WARM="${WARM:-2000}"
if [ -z "${MODULE:-}" ]; then
  cargo build --quiet --release -p tollgate-redis-module --manifest-path "$ROOT/Cargo.toml"
  MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/libtollgate_redis_module.so"
fi
OUT=$(mktemp -d)
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$OUT"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p" --instr-atstart=no \
  redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no --loadmodule "$MODULE" >/dev/null 2>&1 &
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.2; done
redis-benchmark -p "$PORT" -n "$WARM" -c 8 -P 8 -r 10000 -q "$@" >/dev/null 2>&1
callgrind_control -i on >/dev/null
redis-benchmark -p "$PORT" -n "$N" -c 8 -P 8 -r 10000 -q "$@" >/dev/null 2>&1
callgrind_control -i off >/dev/null
redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
wait
IR=$(grep -h "^totals:" "$OUT"/cg.* | head -1 | awk '{print $2}')
echo "$NAME $((IR / N))"
