#!/usr/bin/env bash
# System calls a 1 MiB one-way message costs each side of the engine's stream: `strace -f -c`
# of `serve … sink` and of `client … stream` (Benchmarks/RoundTripInstructions, built in release
# from the working tree), MESSAGES messages of 1 MiB, both processes on CPU 0. Writes
# OUT/strace-server.txt and OUT/strace-client.txt and prints the calls a message of each kind
# the loops make (io_uring_enter, epoll_ctl, epoll_pwait, recvfrom, sendmsg).
#
#   [MESSAGES=1000] Reports/kernel-receive-chain/strace-counts.sh OUT
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
out=$1 messages=${MESSAGES:-1000}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
swift build -c release --package-path Benchmarks --product round-trip-instructions > /dev/null
binary=Benchmarks/.build/release/round-trip-instructions
group=$(mktemp -d /tmp/strace-counts-XXXX)
strace -f -c -o "$out/strace-server.txt" taskset -c 0 "$binary" serve "$group" sink > "$group/server.log" 2>&1 &
server=$!
Scripts/wait-for-server.sh "$group" "$server"
strace -f -c -o "$out/strace-client.txt" taskset -c 0 "$binary" client "$group" "$messages" 1048576 stream > /dev/null 2> "$group/client.log"
wait "$server"
rm -rf "$group"
for side in server client; do
    printf '%s:' "$side"
    for call in io_uring_enter epoll_ctl epoll_pwait recvfrom sendmsg; do
        count=$(awk -v call="$call" '$NF == call { print $4 }' "$out/strace-$side.txt" | head -1)
        printf ' %s %s' "$call" "$(python3 -c "print(round(${count:-0} / $messages, 2))")"
    done
    echo
done
