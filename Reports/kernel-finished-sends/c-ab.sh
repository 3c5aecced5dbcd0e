#!/usr/bin/env bash
# The C experiment of Reports/kernel-finished-sends (stream-uring.patch applied to a copy of
# Benchmarks/StreamCost/stream-cost.c; the patch's comment says what each variant does),
# alternated three times on CPU 0: 3,000
# messages of 1 MiB, each message read whole (--frames), with the sender and receiver each the
# epoll way or io_uring's. Prints each run's messages a second and the receiver's CPU time.
#
#   Reports/kernel-finished-sends/c-ab.sh
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
cp ../../Benchmarks/StreamCost/stream-cost.c "$work/stream-uring.c"
patch -s "$work/stream-uring.c" < stream-uring.patch
cc -O2 -o /tmp/stream-uring "$work/stream-uring.c"
for round in 1 2 3; do
    for variant in epoll send-ring send-enter recv both both-enter; do
        unset RECV
        arguments=()
        case $variant in
            send-ring) arguments=(--uring-epoll) ;;
            send-enter) arguments=(--uring) ;;
            recv) export RECV=1 ;;
            both) export RECV=1; arguments=(--uring-epoll) ;;
            both-enter) export RECV=1; arguments=(--uring) ;;
        esac
        printf '%s %-10s ' "$round" "$variant"
        taskset -c 0 /tmp/stream-uring "${arguments[@]}" --frames 1048576 3000 | grep -E 'messages/s|receiver' | sed 's/1048576-byte payloads, SO_SNDBUF [0-9]*, each message read whole into one buffer: //' | tr '\n' ' '
        echo
    done
done
