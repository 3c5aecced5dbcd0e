#!/usr/bin/env bash
# Long one-way streams, alternated: the C floor `unix-stream+io_uring` (floor-stream.c) and the
# engine's unix-socket stream (Benchmarks/RoundTripInstructions, `client … stream` against
# `serve … sink`, built from the working tree), ROUNDS rounds of MESSAGES messages of BYTES, the
# sender on CPU 0 and the receiver on SERVER_CPU. Prints each run's microseconds a message.
#
#   [SERVER_CPU=1] [ROUNDS=5] [MESSAGES=2000] [BYTES=1048576] Reports/kernel-receive-chain/engine-vs-c.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-5} messages=${MESSAGES:-2000} bytes=${BYTES:-1048576} server_cpu=${SERVER_CPU:-1}
cc -O2 -I Sources/CNativeFloor/include -I Sources/CNativeFloor -I Sources/CIPCShims/include \
    -o /tmp/floor-stream Reports/kernel-receive-chain/floor-stream.c Sources/CNativeFloor/*.c Sources/CIPCShims/shims.c -lrt -lpthread
swift build -c release --package-path Benchmarks --product round-trip-instructions > /tmp/engine-vs-c.build.log 2>&1 || { cat /tmp/engine-vs-c.build.log >&2; exit 1; }
binary=Benchmarks/.build/release/round-trip-instructions
for round in $(seq 1 "$rounds"); do
    c=$(/tmp/floor-stream 13 "$server_cpu" "$messages" "$bytes" | grep -o '[0-9.]* µs a message;' | cut -d' ' -f1)
    echo "$round C unix-stream+io_uring $c µs a message"
    echo "$round engine $(Reports/kernel-receive-chain/stream-once.sh "$binary" "$server_cpu" "$messages" "$bytes") µs a message"
done
