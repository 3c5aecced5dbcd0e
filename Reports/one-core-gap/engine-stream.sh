#!/usr/bin/env bash
# One run of the engine's one-way stream (Benchmarks/RoundTripInstructions: `client … stream`
# against `serve … sink`), unix-socket binary, both processes on the CPUs given (default: both on
# CPU 0). Prints messages a second, from the first send to the reply that follows the last.
# SERVER_MODE and CLIENT_MODE replace `sink` and `stream` (the Swift floor's: `floor-sink`,
# `floor-stream`).
#   Reports/one-core-gap/engine-stream.sh BIN BYTES MESSAGES [SERVER_CPU CLIENT_CPU [SERVER_MODE CLIENT_MODE]]
set -euo pipefail
[ $# -eq 3 ] || [ $# -eq 5 ] || [ $# -eq 7 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
binary=$1 bytes=$2 messages=$3 server_cpu=${4:-0} client_cpu=${5:-0} server_mode=${6:-sink} client_mode=${7:-stream}
[ -x "$binary" ] || { echo "not an executable: $binary" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
taskset -c "$server_cpu" "$binary" serve "$dir" "$server_mode" > "$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do [ -S "$dir/echo.sock" ] && break; sleep 0.05; done
[ -S "$dir/echo.sock" ] || { echo "the server did not start:" >&2; cat "$dir/server.log" >&2; kill "$server"; exit 1; }
line=$(ROUND_TRIP_TIMES=1 taskset -c "$client_cpu" "$binary" client "$dir" "$messages" "$bytes" "$client_mode")
wait "$server"
nanoseconds=$(echo "$line" | awk '{print $4}')
awk -v n="$messages" -v ns="$nanoseconds" -v b="$bytes" -v pair="$client_mode → $server_mode" 'BEGIN { printf "%s %d: %.0f messages/s\n", pair, b, n / (ns / 1e9) }'
