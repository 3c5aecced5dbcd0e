#!/usr/bin/env bash
# Which system calls, and how many context switches, a one-way stream costs: the engine's
# (Benchmarks/RoundTripInstructions, client and server counted apart) and the C epoll stream's
# (Benchmarks/StreamCost, both sides together), both processes on CPU 0. Needs perf.
#   Reports/one-core-gap/syscall-kinds.sh BIN STREAM_COST BYTES MESSAGES
set -euo pipefail
[ $# -eq 4 ] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
binary=$1 stream_cost=$2 bytes=$3 messages=$4
events=context-switches
for call in sendmsg sendto recvfrom read epoll_wait epoll_ctl futex write; do events+=",syscalls:sys_enter_$call"; done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
taskset -c 0 perf stat -x, -e "$events" -o "$dir/server.perf" "$binary" serve "$dir" sink > "$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do [ -S "$dir/echo.sock" ] && break; sleep 0.05; done
[ -S "$dir/echo.sock" ] || { echo "the server did not start" >&2; kill "$server"; exit 1; }
taskset -c 0 perf stat -x, -e "$events" -o "$dir/client.perf" "$binary" client "$dir" "$messages" "$bytes" stream
wait "$server"
taskset -c 0 perf stat -x, -e "$events" -o "$dir/c.perf" "$stream_cost" "$bytes" "$messages" > "$dir/c.log"
echo "$bytes-byte messages, $messages of them; per message:"
printf '%-28s %10s %10s %14s\n' event "engine client" "engine server" "C, both sides"
for event in ${events//,/ }; do
    per() { awk -F, -v e="$event" -v n="$messages" '$3 == e { printf "%.3f", $1 / n }' "$1"; }
    printf '%-28s %10s %10s %14s\n' "${event#syscalls:sys_enter_}" "$(per "$dir/client.perf")" "$(per "$dir/server.perf")" "$(per "$dir/c.perf")"
done
grep messages/s "$dir/c.log"
