#!/usr/bin/env bash
# Interleaved A/B runs of `budgetscope-bench ingest` against two server builds: for each configuration, PAIRS
# pairs, odd pairs running build A then build B and even pairs B then A, so both see the
# same minutes of this noisy machine and neither always goes first. Prints one line per
# run: configuration, pair, build, committed spans/s, raw ceiling, ratio, server CPU
# seconds, export p50 / p99; then, per configuration, each build's mean committed spans/s
# and server CPU and the pairs each build won. One harness drives both servers
# (BENCH, default target/release/budgetscope-bench). Usage:
#   cp target/release/budgetscope /tmp/bs-a   # build A (e.g. on the commit before)
#   cp target/release/budgetscope /tmp/bs-b   # build B
#   benches/ab.sh /tmp/bs-a /tmp/bs-b [PAIRS] [-- extra bench flags, e.g. --no-ceiling]
# AB_CONFIG="--transport http-json --batch 512 --concurrency 8 --spans 100000" runs that
# one configuration instead of the four below.
set -euo pipefail
a="$1" b="$2"
shift 2
pairs="${1:-2}"
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")
bench="${BENCH:-$(dirname "$0")/../target/release/budgetscope-bench}"

configs=(
  "--transport grpc --batch 512 --concurrency 8 --spans 200000"
  "--transport grpc --batch 100 --concurrency 8 --spans 200000"
  "--transport http-proto --batch 512 --concurrency 8 --spans 200000 --gzip"
  "--transport http-json --batch 512 --concurrency 8 --spans 100000"
)
[ -n "${AB_CONFIG:-}" ] && configs=("$AB_CONFIG")
field() { echo "$1" | grep -F "| $2" | head -n1 | awk -F'|' '{print $3}' | awk '{print $1}'; }
for config in "${configs[@]}"; do
  runs=$(mktemp)
  for pair in $(seq 1 "$pairs"); do
    order=("$a" "$b")
    [ $((pair % 2)) = 0 ] && order=("$b" "$a")
    for bin in "${order[@]}"; do
      # shellcheck disable=SC2086
      out=$("$bench" ingest --server "$bin" $config "${extra[@]}" 2>/dev/null) || { echo "$bin failed on [$config]" >&2; exit 1; }
      rate=$(field "$out" 'committed spans/s')
      cpu=$(field "$out" 'server CPU |')
      echo "$pair $bin $rate $cpu" >> "$runs"
      echo "$config | pair $pair | $bin | $rate | $(field "$out" 'raw ceiling: same rows, store INSERT') | $(field "$out" 'end to end / raw INSERT') | ${cpu} s | $(echo "$out" | grep -F '| export latency' | awk -F'|' '{print $3}')"
    done
  done
  awk -v a="$a" -v b="$b" -v config="$config" '
    { rate[$1, $2] = $3; cpu[$1, $2] = $4; sum[$2] += $3; cpus[$2] += $4; n[$2]++; pairs[$1] = 1 }
    END {
      for (p in pairs) { if (rate[p, b] > rate[p, a]) bwins++; else awins++ }
      printf "%s | summary | A %s: mean %.0f spans/s, %.3f s CPU; B %s: mean %.0f spans/s, %.3f s CPU; B faster in %d of %d pairs\n",
        config, a, sum[a] / n[a], cpus[a] / n[a], b, sum[b] / n[b], cpus[b] / n[b], bwins, awins + bwins
    }' "$runs"
  rm -f "$runs"
done
