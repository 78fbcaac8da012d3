#!/usr/bin/env bash
# Runs `budgetscope-bench ingest` several times per configuration and prints, per
# configuration, the median and range of the end-to-end rate, its ratio to the same run's
# raw ceiling, export latency and server memory. Usage:
#   benches/ingest.sh [REPEATS] [-- extra bench flags, e.g. --db postgres://…]
# Figures in BENCHMARKS.md come from this script on the project's 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats="${1:-3}"
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")
cargo build --release --quiet
bin=target/release/budgetscope-bench

configs=(
  "--transport grpc --batch 512 --concurrency 8 --spans 200000"
  # Sustained: long enough (~30 s) for the background analyzer to run beside ingest.
  "--transport grpc --batch 512 --concurrency 8 --spans 1000000"
  "--transport grpc --batch 100 --concurrency 8 --spans 200000"
  "--transport grpc --batch 100 --concurrency 32 --spans 200000"
  "--transport http-proto --batch 512 --concurrency 8 --spans 200000 --gzip"
  "--transport http-json --batch 512 --concurrency 8 --spans 100000"
  # The same row count as the other 512-span rows: a 100k-row ceiling goes into a smaller
  # table and runs faster.
  "--transport http-json --batch 512 --concurrency 8 --spans 200000"
)

field() { grep -F "| $1" "$2" | head -n1 | awk -F'|' '{print $3}' | awk '{print $1}'; }
median_range() { sort -g | awk '{v[NR]=$1} END {m=(NR%2)?v[(NR+1)/2]:(v[NR/2]+v[NR/2+1])/2; printf "%s (%s–%s)", m, v[1], v[NR]}'; }

printf '| configuration | committed spans/s | raw ceiling spans/s | ratio | p50 / p99 ms | peak RSS (anonymous) MiB | traces summarised during the run |\n|---|---|---|---|---|---|---|\n'
for config in "${configs[@]}"; do
  rates=(); ceilings=(); ratios=(); lat=""; rss=""; summarised=""
  for i in $(seq 1 "$repeats"); do
    out=$(mktemp)
    # shellcheck disable=SC2086
    $bin ingest $config "${extra[@]}" > "$out" 2> "$out.err" || { cat "$out.err" >&2; exit 1; }
    rates+=("$(field 'committed spans/s' "$out")")
    ceilings+=("$(field 'raw ceiling: same rows, store INSERT' "$out")")
    ratios+=("$(field 'end to end / raw INSERT' "$out")")
    lat=$(grep -F '| export latency' "$out" | awk -F'|' '{print $3}' | sed 's/ ms//g; s/^ //; s/ $//')
    rss="$(field 'server peak RSS' "$out" | sed 's/MiB//') ($(field 'server peak anonymous RSS' "$out" | sed 's/MiB//'))"
    summarised=$(grep -F '| traces summarised' "$out" | awk -F'|' '{print $3}' | sed 's/^ //; s/ $//')
    echo "  run $i of [$config]: ${rates[-1]} spans/s, ceiling ${ceilings[-1]}, ratio ${ratios[-1]}" >&2
    rm -f "$out" "$out.err"
  done
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$config" \
    "$(printf '%s\n' "${rates[@]}" | median_range)" \
    "$(printf '%s\n' "${ceilings[@]}" | median_range)" \
    "$(printf '%s\n' "${ratios[@]}" | median_range)" "$lat" "$rss" "$summarised"
done
