#!/usr/bin/env bash
# Builds ipcbench in release mode and runs it. With no arguments this is the default run:
# every transport and framing, same-core and split-cores, payloads 0 B to 1 MiB; it prints a
# table and writes Reports/runs/<date>/results.json and report.md.
#
#   Scripts/bench.sh [--references] [ipcbench arguments...]
#
# --references also builds and measures the reference systems of Benchmarks/References (ZeroMQ,
# D-Bus, SwiftNIO, gRPC, iceoryx; their Debian packages are installed first) in the same interleaved run,
# and the report opens with "Which should I use". A reference that cannot be built or started
# is listed in the report with the reason. Other arguments go to ipcbench (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."

references=false
arguments=()
for argument in "$@"; do
    if [ "$argument" = "--references" ]; then references=true; else arguments+=("$argument"); fi
done

Scripts/install-system-packages.sh
if [ "$references" = true ]; then
    Benchmarks/References/install-system-packages.sh
    # A reference that does not build is skipped (build.sh says why); the run still goes on.
    Benchmarks/References/build.sh >&2 || echo "some reference systems did not build; the report lists them as skipped" >&2
    arguments+=(--references Benchmarks/References/.build/bin)
fi
swift build -c release --product ipcbench
exec .build/release/ipcbench "${arguments[@]}"
