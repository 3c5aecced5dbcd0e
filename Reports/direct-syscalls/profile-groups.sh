#!/usr/bin/env bash
# Where a 64-byte round trip's user-space instructions go, engine against the Swift floor, each
# side grouped by what the code is (the connection, the request table, the event loop, framing,
# socket calls, the Swift runtime, libc, the benchmark program itself, which holds the floor's own
# loop and framing). A DWARF 4 build of Benchmarks/RoundTripInstructions (valgrind 3.19 cannot read
# DWARF 5) is run under callgrind for 1,000 and 5,000 round trips, engine (server on-loop, client
# engine) and floor (server floor, client floor-cancellable); the difference over 4,000, per
# function, summed by group. One pair each: a count moves by a couple of hundred between pairs.
#
#   Reports/direct-syscalls/profile-groups.sh [SCRATCH]     (SCRATCH: build folder, default /tmp/rti-dwarf4)
set -euo pipefail
scratch=${1:-/tmp/rti-dwarf4}
cd "$(dirname "$0")/../.."
swift build -c release --package-path Benchmarks --product round-trip-instructions --scratch-path "$scratch" \
    -Xswiftc -dwarf-version=4 -Xcc -gdwarf-4 -Xswiftc -Xcc -Xswiftc -gdwarf-4 >&2
binary="$scratch/release/round-trip-instructions"
work=$(mktemp -d "${TMPDIR:-/tmp}/profile-groups-XXXXXX")
trap 'rm -rf "$work"' EXIT
run() { Scripts/callgrind-pair.sh "$binary" "$2" "$3" "$4" "$work/$1-$4" > /dev/null; } # TAG SERVER CLIENT TRIPS
for trips in 1000 5000; do run engine on-loop engine "$trips"; run floor floor floor-cancellable "$trips"; done
python3 - "$work" <<'PYTHON'
import re, subprocess, sys
work = sys.argv[1]
def functions(path):
    out = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", path], capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*)$", line)
        if m and ":" in m.group(2):
            counts[m.group(2)] = counts.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return counts
def per_trip(tag, side):
    a, b = functions(f"{work}/{tag}-1000/{side}.out"), functions(f"{work}/{tag}-5000/{side}.out")
    return {k: (b.get(k, 0) - a.get(k, 0)) / 4000 for k in set(a) | set(b)}
GROUPS = [
    ("event loop (rounds, jobs, clock, epoll)", ("EventLoop", "Poller", "MonotonicClock", "DequeModule")),
    ("request table", ("RequestTable", "TokenTable")),
    ("framing (reassembler, decoder)", ("FrameReassembler", "BinaryFram", "IPCFraming")),
    ("socket calls", ("UnixSocket", "syscall", "IPCSystem")),
    ("connection (dispatch, send path)", ("EngineConnection", "ConnectionCore", "IPCCore", "PolledRead")),
    ("Swift concurrency runtime", ("libswift_Concurrency", "swift::", "swift_task", "withTaskCancellation", "Continuation")),
    ("Swift core runtime (ARC, arrays)", ("libswiftCore", "swift_", "ContiguousArray", "copyCollection")),
    ("libc (malloc, locks, clock)", ("libc.so", "malloc", "nptl", "clock_gettime", "sysdeps")),
    ("benchmark program (the floor's own loop and framing)", ("round-trip-instructions", "round_trip", "SwiftFloor")),
]
def group(name):
    return next((g for g, keys in GROUPS if any(k in name for k in keys)), "other")
for side in ("client", "server"):
    engine, floor = per_trip("engine", side), per_trip("floor", side)
    sums = {}
    for name in set(engine) | set(floor):
        e, f = sums.get(group(name), (0.0, 0.0))
        sums[group(name)] = (e + engine.get(name, 0), f + floor.get(name, 0))
    print(f"\n{side}: engine {sum(engine.values()):,.0f}, floor {sum(floor.values()):,.0f} instructions a round trip\n")
    print("| group | engine | floor | engine − floor |\n|---|---:|---:|---:|")
    for name, (e, f) in sorted(sums.items(), key=lambda item: item[1][1] - item[1][0]):
        print(f"| {name} | {e:,.0f} | {f:,.0f} | {e - f:+,.0f} |")
PYTHON
