#!/usr/bin/env bash
# Redis CPU per call of Tollgate's module command (`TOLLGATE.DECIDE`) beside
# the classic token-bucket script and `SET`, on one throwaway redis-server
# that loads the module, in interleaved rounds: the method of the peer
# harness's script_cost.sh (redis-benchmark, 32 clients, pipelines of 8,
# 10,000 keys, INFO commandstats usec_per_call), which cannot load a module.
# Every call admits and writes. The sliding log's keys are filled first to
# about 100 entries each (one-hour window).
#
#   backends/redis/benches/module_cost.sh            # ROUNDS=5 N=100000 PORT=6393
#   MODULE=/path/to/libtollgate_redis_module.so …    # another build (before/after)
#
# Prints one line per round: µs per call of each command.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
PORT="${PORT:-6393}" N="${N:-100000}" ROUNDS="${ROUNDS:-5}" PREFILL="${PREFILL:-1000000}"
if [ -z "${MODULE:-}" ]; then
  cargo build --quiet --release -p tollgate-redis-module --manifest-path "$ROOT/Cargo.toml"
  MODULE="${CARGO_TARGET_DIR:-$ROOT/target}/release/libtollgate_redis_module.so"
fi
CLASSIC_LUA="$ROOT/backends/redis/benches/fixtures/classic_token_bucket.lua"
if redis-cli -p "$PORT" PING >/dev/null 2>&1; then echo "module_cost.sh: port $PORT is taken (PORT=...)" >&2; exit 1; fi
redis-server --bind 127.0.0.1 --port "$PORT" --save '' --appendonly no --daemonize yes \
  --loadmodule "$MODULE" --pidfile "/tmp/module-cost-$PORT.pid" >/dev/null
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.1; done
CLASSIC=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$CLASSIC_LUA")")
usec() { redis-cli -p "$PORT" INFO commandstats | tr -d '\r' | awk -F'[=,]' -v c="cmdstat_$1:" 'index($0,c)==1{for(i=1;i<=NF;i++) if($i=="usec_per_call") print $(i+1)}'; }
bench() { local n=$1; shift; redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null; redis-benchmark -p "$PORT" -n "$n" -c 32 -P 8 -r 10000 -q "$@" >/dev/null 2>&1; }
# TOLLGATE.DECIDE <numkeys> <key>... <now: server's> <skew> <code> <cost> <p1> <p2> <p3>
decide() { local n=$1; shift; bench "$n" TOLLGATE.DECIDE "$@"; usec tollgate.decide; }
HOUR=3600000000
bench "$PREFILL" TOLLGATE.DECIDE 1 'log:{__rand_int__}' '' '' 5 1 10000 $HOUR 0
echo "sliding log entries per key (one sampled): $(redis-cli -p "$PORT" LLEN 'log:{000000001234}')"
for r in $(seq "$ROUNDS"); do
  bench "$N" EVALSHA "$CLASSIC" 1 tb:__rand_int__ 1000000 1000000 1; classic=$(usec evalsha)
  tb=$(decide "$N" 1 't:{__rand_int__}' '' '' 1 1 1000000 1000000 1000000)
  gcra=$(decide "$N" 1 'g:{__rand_int__}' '' '' 2 1 1000000 1 0)
  fw=$(decide "$N" 1 'f:{__rand_int__}' '' '' 3 1 1000000000 $HOUR 0)
  sw=$(decide "$N" 1 's:{__rand_int__}' '' '' 4 1 1000000 $HOUR 0)
  log=$(decide $((N / 5)) 1 'log:{__rand_int__}' '' '' 5 1 10000 $HOUR 0)
  three=$(decide "$N" 3 'a:{__rand_int__}' 'a:{__rand_int__}:t' 'a:{__rand_int__}:g' '' '' \
    1 1 1000000 1000000 1000000 1 1 1000000 1000000 1000000 1 1 1000000 1000000 1000000)
  bench "$N" SET s:__rand_int__ 12345; set=$(usec set)
  echo "round=$r classic=$classic token_bucket=$tb gcra=$gcra fixed_window=$fw sliding_window=$sw sliding_log=$log three_layers=$three set=$set"
done
echo "sliding log entries per key after (one sampled): $(redis-cli -p "$PORT" LLEN 'log:{000000001234}')"
