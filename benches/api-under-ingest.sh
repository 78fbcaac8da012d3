#!/usr/bin/env bash
# How fast the JSON API answers while the server ingests flat out: starts
# `budgetscope-bench ingest --transport grpc --batch 512 --concurrency 8 --spans 2000000 --no-ceiling`
# with the given build, and while it runs times 40 requests to /api/services, 100 ms apart.
# Prints p50 / p90 / max of those requests and the run's committed rate. Usage:
#   benches/api-under-ingest.sh [SERVER]   (default target/release/budgetscope, driven by
#   target/release/budgetscope-bench)
# Needs curl and ss (iproute2).
set -euo pipefail
bin="${1:-target/release/budgetscope}"
out=$(mktemp) err=$(mktemp)
"$(dirname "$0")/../target/release/budgetscope-bench" ingest --server "$bin" --transport grpc --batch 512 --concurrency 8 --spans 2000000 \
  --no-ceiling > "$out" 2> "$err" &
bench=$!
pid=""
for _ in $(seq 1 100); do
  pid=$(grep -o "server pid [0-9]*" "$err" | awk '{print $3}' || true)
  [ -n "$pid" ] && break
  sleep 0.2
done
[ -n "$pid" ] || { cat "$err" >&2; echo "the benchmark's server did not start" >&2; exit 1; }
sleep 1
# The server's three listeners; the UI and API one answers /healthz.
api=""
for port in $(ss -ltnp | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://'); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$port/healthz")" = 200 ] && api=$port
done
[ -n "$api" ] || { echo "no listener of server $pid answered /healthz" >&2; exit 1; }
times=()
for _ in $(seq 1 40); do
  times+=("$(curl -s -o /dev/null -w '%{time_total}' -m 5 "http://127.0.0.1:$api/api/services")")
  sleep 0.1
done
wait "$bench"
printf '%s\n' "${times[@]}" | sort -g | awk '{v[NR]=$1} END {
  printf "/api/services during ingest: %d requests, p50 %.1f ms, p90 %.1f ms, max %.1f ms\n",
    NR, v[int(NR/2)]*1000, v[int(NR*0.9)]*1000, v[NR]*1000 }'
grep -F "committed spans/s" "$out"
rm -f "$out" "$err"
