#!/usr/bin/env bash
# Alternated rounds of the message-port rows, an old build against a new one, then the medians
# of each row's p50 and p99 and of its p50 divided by the C floor of the same work in that run.
#
#   Reports/message-port-exclusivity/ab.sh OLD_IPCBENCH NEW_IPCBENCH DIR [ROUNDS]
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
old=$1 new=$2 dir=$3 rounds=${4:-5}
mkdir -p "$dir"
for round in $(seq 1 "$rounds"); do
    for side in old new; do
        binary=$old; [ "$side" = new ] && binary=$new
        "$binary" run --full --transport message-port --sizes 64 --skip-throughput --skip-invalidation \
            --skip-in-process --skip-scale --skip-global-executor --no-progress --output "$dir/$side-$round" > /dev/null
    done
done
python3 - "$dir" "$rounds" <<'PYTHON'
import json, statistics, sys
directory, rounds = sys.argv[1], int(sys.argv[2])
# The C floor that does each row's work (the harness's "same-work floor").
floors = {
    ("blocking", "task"): "floor:mqueue+epoll+handoff", ("blocking", "on-loop"): "floor:mqueue+epoll",
    ("spin-then-block", "task"): "floor:mqueue+spin+handoff", ("spin-then-block", "on-loop"): "floor:mqueue+spin",
}
rows = {}
for side in ("old", "new"):
    for round in range(1, rounds + 1):
        latency = json.load(open(f"{directory}/{side}-{round}/results.json"))["latency"]
        p50 = {(r["transport"], r["placement"], r["waitStrategy"]): r["p50"] for r in latency if r["transport"].startswith("floor:")}
        for r in latency:
            if r["transport"] != "message-port":
                continue
            floor = p50[(floors[(r["waitStrategy"], r["handler"])], r["placement"], r["waitStrategy"])]
            rows.setdefault((r["placement"], r["waitStrategy"], r["handler"]), {}).setdefault(side, []).append((r["p50"], r["p99"], r["p50"] / floor))
print("| row | p50 old (rounds) | p50 new (rounds) | p99 old, new | p50 ÷ same-work floor, old, new |")
print("|---|---|---|---|---|")
for (placement, wait, handler), sides in rows.items():
    def span(values):
        return f"{statistics.median(values) / 1000:.2f} µs ({min(values) / 1000:.2f}–{max(values) / 1000:.2f})"
    old, new = sides["old"], sides["new"]
    print(f"| {placement}, {wait}, {handler} | {span([v[0] for v in old])} | {span([v[0] for v in new])} | "
          f"{statistics.median(v[1] for v in old) / 1000:.1f}, {statistics.median(v[1] for v in new) / 1000:.1f} µs | "
          f"{statistics.median(v[2] for v in old):.3f}, {statistics.median(v[2] for v in new):.3f} |")
PYTHON
