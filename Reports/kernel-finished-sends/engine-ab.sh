#!/usr/bin/env bash
# The engine's one-way stream with and without the send ring (send-ring.patch applied and both
# binaries built: `swift build -c release --package-path Benchmarks --product round-trip-instructions`),
# alternated: `client … stream` against `serve … sink`, the client on CPU 0 and the server on
# SERVER_CPU (0: same core, 1: two cores), ROUNDS rounds of MESSAGES messages of BYTES each.
# IPCBENCH_LARGE_SENDS picks the path in both processes (VARIABLE=IPCBENCH_LARGE_TRANSFERS for
# the code of Reports/kernel-transfers, which reads that one). Prints each run's microseconds a
# message.
#
#   [VARIABLE=IPCBENCH_LARGE_SENDS] [SERVER_CPU=0] [ROUNDS=5] [MESSAGES=2000] [BYTES=1048576] Reports/kernel-finished-sends/engine-ab.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
binary=Benchmarks/.build/release/round-trip-instructions
variable=${VARIABLE:-IPCBENCH_LARGE_SENDS}
rounds=${ROUNDS:-5} messages=${MESSAGES:-2000} bytes=${BYTES:-1048576} server_cpu=${SERVER_CPU:-0}
for round in $(seq 1 "$rounds"); do
    for sends in io_uring epoll; do
        group=$(mktemp -d /tmp/engine-ab-XXXX)
        env "$variable=$sends" taskset -c "$server_cpu" "$binary" serve "$group" sink > "$group/server.log" 2>&1 &
        server=$!
        Scripts/wait-for-server.sh "$group" "$server"
        line=$(env "$variable=$sends" ROUND_TRIP_TIMES=1 taskset -c 0 "$binary" client "$group" "$messages" "$bytes" stream 2> "$group/client.log")
        wait "$server"
        nanoseconds=$(echo "$line" | grep -o '[0-9]* ns' | cut -d' ' -f1)
        echo "$round $sends $(python3 -c "print(round($nanoseconds / 1000 / $messages, 2))") µs a message"
        rm -rf "$group"
    done
done
