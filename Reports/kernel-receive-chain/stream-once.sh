#!/usr/bin/env bash
# One run of the engine's one-way stream (Benchmarks/RoundTripInstructions built in release):
# `serve … sink` on SERVER_CPU, `client … stream` of MESSAGES messages of BYTES on CPU 0. Prints
# the microseconds a message. The one run binary-ab.sh and engine-vs-c.sh alternate. Run from
# the repository's root (it uses Scripts/wait-for-server.sh).
#
#   Reports/kernel-receive-chain/stream-once.sh BINARY SERVER_CPU MESSAGES BYTES
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
binary=$1 server_cpu=$2 messages=$3 bytes=$4
group=$(mktemp -d /tmp/stream-once-XXXX)
trap 'rm -rf "$group"' EXIT
taskset -c "$server_cpu" "$binary" serve "$group" sink > "$group/server.log" 2>&1 &
server=$!
Scripts/wait-for-server.sh "$group" "$server"
line=$(ROUND_TRIP_TIMES=1 taskset -c 0 "$binary" client "$group" "$messages" "$bytes" stream 2> "$group/client.log")
wait "$server"
nanoseconds=$(echo "$line" | grep -o '[0-9]* ns' | cut -d' ' -f1)
python3 -c "print(round($nanoseconds / 1000 / $messages, 2))"
