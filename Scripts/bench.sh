#!/usr/bin/env bash
# Builds ipcbench in release mode and runs it. With no arguments this is the default run:
# every transport and framing, same-core and split-cores, payloads 0 B to 1 MiB; it prints a
# table and writes Reports/runs/<date>/results.json and report.md.
# Arguments go to ipcbench (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."

Scripts/install-system-packages.sh
swift build -c release --product ipcbench
exec .build/release/ipcbench "$@"
