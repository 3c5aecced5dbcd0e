#!/usr/bin/env bash
# A native floor's user-space instructions a round trip, each side, in two trees side by side:
# floor-count.c built against each tree's Sources/CNativeFloor (gcc -O2, as the Google Benchmark
# cross-check builds it), run under callgrind (--trace-children) with 1,000 and 5,000 round trips
# of 64 bytes; the difference over 4,000, each process apart. Prints one line a tree and
# mechanism.
#
#   Reports/direct-syscalls/floor-count.sh OLD_TREE NEW_TREE MECHANISM...
#   (e.g. /tmp/old . unix-stream unix-stream+epoll mqueue; FLOOR_COUNT_ONE_THREAD=1 in the
#   environment: each process single-threaded, as glibc's wrappers' cheaper case)
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
old=$(realpath "$1") new=$(realpath "$2")
shift 2
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d "${TMPDIR:-/tmp}/floor-count-XXXXXX")
trap 'rm -rf "$work"' EXIT
for tree in old new; do
    root=${!tree}
    shims=$root/Sources/CIPCShims/include
    gcc -O2 -std=gnu11 -w -I"$root/Sources/CNativeFloor/include" -I"$shims" \
        -o "$work/$tree" "$here/floor-count.c" "$root"/Sources/CNativeFloor/*.c -lpthread -lrt
done
count() { # BINARY MECHANISM TRIPS: "initiator responder" totals
    local out=$work/out-$RANDOM
    mkdir "$out"
    valgrind --tool=callgrind --trace-children=yes --callgrind-out-file="$out/%p" "$1" "$2" "$3" > "$out/log" 2>&1 \
        || { cat "$out/log" >&2; exit 1; }
    # The lower process id is the initiator (it forks the responder).
    for file in $(ls "$out" | grep -v log | sort -n); do sed -n 's/^totals: //p' "$out/$file"; done | tr '\n' ' '; echo
}
for mechanism in "$@"; do
    for tree in old new; do
        read -r i1 r1 < <(count "$work/$tree" "$mechanism" 1000)
        read -r i5 r5 < <(count "$work/$tree" "$mechanism" 5000)
        echo "$tree $mechanism: initiator $(( (i5 - i1) / 4000 )), responder $(( (r5 - r1) / 4000 )), both $(( (i5 - i1 + r5 - r1) / 4000 ))"
    done
done
