#!/usr/bin/env bash
# The distinct cache lines (code, data) one round trip touches in each process, counted from a
# lackey memory trace of BIN (a round-trip-instructions binary stripped of its DWARF, which
# valgrind 3.19 cannot read): a server SERVER_MODE and a client CLIENT_MODE, ROUND_TRIPS round
# trips of 64 bytes, windows of 100 round trips' instructions (SERVER_INSTRUCTIONS and
# CLIENT_INSTRUCTIONS per round trip, from Scripts/instructions.sh). Prints each side's steady
# count, and keeps every window in OUT/TAG.{server,client}.txt.
#
#   Reports/loop-jobs/trace-lines.sh BIN SERVER_MODE CLIENT_MODE ROUND_TRIPS SERVER_INSTRUCTIONS CLIENT_INSTRUCTIONS OUT TAG
set -euo pipefail
[ $# -eq 8 ] || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
binary=$(realpath "$1") server=$2 client=$3 trips=$4 server_each=$5 client_each=$6 out=$(realpath -m "$7") tag=$8
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/trace-lines-XXXXXX")
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/trace-lines" "$here/trace-lines.c"
mkdir -p "$out"
mkfifo "$work/server.trace" "$work/client.trace"
"$work/trace-lines" $((100 * server_each)) < "$work/server.trace" > "$out/$tag.server.txt" &
valgrind --tool=lackey --trace-mem=yes --log-file="$work/server.trace" "$binary" serve "$work" "$server" > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do [ -S "$work/echo.sock" ] && break; sleep 0.1; done
[ -S "$work/echo.sock" ] || { echo "the server did not start:" >&2; cat "$work/server.log" >&2; kill "$server_pid"; exit 1; }
"$work/trace-lines" $((100 * client_each)) < "$work/client.trace" > "$out/$tag.client.txt" &
valgrind --tool=lackey --trace-mem=yes --log-file="$work/client.trace" "$binary" client "$work" "$trips" 64 "$client" > "$work/client.log" 2>&1
wait
# The steady state is the last run of at least three equal windows in a row (start-up, waiting
# and teardown windows differ from one another).
for side in server client; do
    steady=$(awk '{print $2, $3}' "$out/$tag.$side.txt" | uniq -c | awk '$1 >= 3 {last = $2 " code lines, " $3 " data lines a round trip (" $1 " windows of 100 in a row)"} END {print last}')
    echo "$tag $side: ${steady:-no three equal windows in a row: run more round trips}"
done
