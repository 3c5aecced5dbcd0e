#!/usr/bin/env bash
# Waits for a round-trip-instructions server (Benchmarks/RoundTripInstructions) started with group
# directory GROUP to listen: until GROUP/echo.sock (a unix-socket server's, the Swift floor's) or
# GROUP/echo.ready (what an engine server of any transport makes once it listens) exists. Exits 1, with GROUP/server.log on
# standard error, if the process PID ends first or SECONDS (default 60) pass. The one wait of
# Scripts/callgrind-pair.sh, round-trip-ab.sh, swift-floor.sh and stream-syscalls.sh.
#
#   Scripts/wait-for-server.sh GROUP PID [SECONDS]
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
group=$1 pid=$2 limit=${3:-60}
rounds=0
while [ ! -S "$group/echo.sock" ] && [ ! -e "$group/echo.ready" ]; do
    if [ "$rounds" -ge $((limit * 50)) ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "the server did not start:" >&2; cat "$group/server.log" >&2; exit 1
    fi
    sleep 0.02
    rounds=$((rounds + 1))
done
