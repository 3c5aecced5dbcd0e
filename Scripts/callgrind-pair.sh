#!/usr/bin/env bash
# One server and client of Benchmarks/RoundTripInstructions under callgrind, 64-byte payloads:
# starts the server, waits for its socket (so no connect retry adds to the client's count), runs
# the client for ROUND_TRIPS (for the stream, its messages), waits for the server to end. Leaves
# DIR/server.out and DIR/client.out (and their logs) and prints "SERVER_TOTAL CLIENT_TOTAL",
# the instructions each process ran. A server still running when this exits is stopped.
# The one pair Scripts/instructions.sh, Reports/loop-jobs/count.sh and
# Reports/direct-syscalls/profile-groups.sh count with. BINARY must be one valgrind 3.19 can
# read (stripped of its DWARF, or built with DWARF 4).
#
#   Scripts/callgrind-pair.sh BINARY SERVER_MODE CLIENT_MODE ROUND_TRIPS DIR
set -euo pipefail
[ $# -eq 5 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
binary=$1 handler=$2 client=$3 trips=$4 dir=$5
server= client_pid=
# Stopped on the way out if still running. (The client runs in the background and is waited
# for, so that a signal to this script is handled at once, not when the client ends.)
trap 'for pid in $client_pid $server; do kill "$pid" 2>/dev/null || true; done' EXIT
trap 'exit 130' INT TERM
mkdir -p "$dir"
valgrind --tool=callgrind --callgrind-out-file="$dir/server.out" "$binary" serve "$dir" "$handler" > "$dir/server.log" 2>&1 &
server=$!
"$(dirname "$0")/wait-for-server.sh" "$dir" "$server"
valgrind --tool=callgrind --callgrind-out-file="$dir/client.out" "$binary" client "$dir" "$trips" 64 "$client" > "$dir/client.log" 2>&1 &
client_pid=$!
status=0
wait "$client_pid" || status=$?
client_pid=
[ "$status" -eq 0 ] || { echo "the client failed:" >&2; cat "$dir/client.log" >&2; exit 1; }
# The server ends once it sees its client go; a server that has not within two minutes hangs.
waited=0
while kill -0 "$server" 2>/dev/null && [ "$waited" -lt 1200 ]; do
    sleep 0.1
    waited=$((waited + 1))
done
kill -0 "$server" 2>/dev/null && { echo "the server did not end within 120 s of its client:" >&2; cat "$dir/server.log" >&2; exit 1; }
status=0
wait "$server" || status=$?
server=
[ "$status" -eq 0 ] || { echo "the server failed:" >&2; cat "$dir/server.log" >&2; exit 1; }
echo "$(sed -n 's/^totals: //p' "$dir/server.out") $(sed -n 's/^totals: //p' "$dir/client.out")"
