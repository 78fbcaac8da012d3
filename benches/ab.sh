#!/usr/bin/env bash
# Interleaved A/B runs of `bench ingest` for two builds: for each configuration, PAIRS
# pairs, each running build A then build B, so both see the same hour of this noisy
# machine. Prints one line per run: configuration, pair, build, committed spans/s, raw
# ceiling, ratio, export p50 / p99. Usage:
#   cp target/release/budgetscope /tmp/bs-a   # build A (e.g. on the commit before)
#   cp target/release/budgetscope /tmp/bs-b   # build B
#   benches/ab.sh /tmp/bs-a /tmp/bs-b [PAIRS] [-- extra bench flags, e.g. --no-ceiling]
set -euo pipefail
a="$1" b="$2"
shift 2
pairs="${1:-2}"
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")

configs=(
  "--transport grpc --batch 512 --concurrency 8 --spans 200000"
  "--transport grpc --batch 100 --concurrency 8 --spans 200000"
  "--transport http-proto --batch 512 --concurrency 8 --spans 200000 --gzip"
  "--transport http-json --batch 512 --concurrency 8 --spans 100000"
)
field() { echo "$1" | grep -F "| $2" | head -n1 | awk -F'|' '{print $3}' | awk '{print $1}'; }
for config in "${configs[@]}"; do
  for pair in $(seq 1 "$pairs"); do
    for bin in "$a" "$b"; do
      # shellcheck disable=SC2086
      out=$("$bin" bench ingest $config "${extra[@]}" 2>/dev/null) || { echo "$bin failed on [$config]" >&2; exit 1; }
      echo "$config | pair $pair | $bin | $(field "$out" 'committed spans/s') | $(field "$out" 'raw ceiling: same rows, store INSERT') | $(field "$out" 'end to end / raw INSERT') | $(echo "$out" | grep -F '| export latency' | awk -F'|' '{print $3}')"
    done
  done
done
