#!/usr/bin/env bash
# Instructions a round trip of one round-trip-instructions binary, each side, from PAIRS pairs of
# runs under callgrind (1,000 and 5,000 round trips; the difference over 4,000): the median and
# every pair. What Scripts/instructions.sh counts, for one build and one server/client pair, to
# compare two builds side by side. BIN must be stripped of its DWARF (valgrind 3.19 cannot read
# DWARF 5): strip --strip-debug -o BIN Benchmarks/.build/release/round-trip-instructions
#
#   Reports/loop-jobs/count.sh BIN SERVER_MODE CLIENT_MODE [PAIRS]     (e.g. on-loop engine 5)
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
binary=$(realpath "$1") server=$2 client=$3 pairs=${4:-3}
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "PAIRS must be a positive whole number" >&2; exit 64; }
work=$(mktemp -d "${TMPDIR:-/tmp}/count-XXXXXX")
trap 'rm -rf "$work"' EXIT
pair="$(dirname "$(realpath "$0")")/../../Scripts/callgrind-pair.sh"
one() { "$pair" "$binary" "$server" "$client" "$1" "$(mktemp -d "$work/group-XXXXXX")"; }
for _ in $(seq "$pairs"); do echo "$(one 1000) $(one 5000)"; done | python3 -c '
import statistics, sys
client, server = [], []
for line in sys.stdin:
    s1, c1, s5, c5 = map(int, line.split())
    client.append((c5 - c1) / 4000); server.append((s5 - s1) / 4000)
mc, ms = statistics.median(client), statistics.median(server)
print(f"client {mc:,.0f} {[round(x) for x in client]}  server {ms:,.0f} {[round(x) for x in server]}  both {mc + ms:,.0f}")
'
