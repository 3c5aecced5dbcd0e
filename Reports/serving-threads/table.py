"""Table of an interleaved A/B of the default request handler's executor (Reports/serving-threads).

python3 Reports/serving-threads/table.py ab     # same core and split cores, 3 pairs
python3 Reports/serving-threads/table.py split  # split cores only, 3 more pairs
Ratios are within each run: p50 of the row over the p50 of the floor in the same file.
"""
import json, os, statistics, sys

here = os.path.dirname(os.path.abspath(__file__))
prefix = sys.argv[1] if len(sys.argv) > 1 else "ab"
runs = {v: [json.load(open(os.path.join(here, f"{prefix}-{v}-{r}.json")))["latency"] for r in (1, 2, 3)] for v in ("before", "after")}
same_work = {"unix-socket": ["floor:unix-stream+epoll+handoff"], "notify": ["floor:eventfd+epoll", "floor:eventfd+io_uring"],
             "message-port": ["floor:mqueue+epoll"], "file-presenter": ["floor:journal"]}
# Each transport's own hand-off floor where a file has it (runs since notify's and message-port's
# were added), else unix-socket's, the only one these files have.
hand_off = {"unix-socket": "floor:unix-stream+epoll+handoff", "notify": "floor:eventfd+epoll+handoff",
            "message-port": "floor:mqueue+epoll+handoff"}


def find(rows, transport, framing, placement, size, handler=None):
    for row in rows:
        if (row["transport"], row.get("framing"), row["placement"], row["payloadBytes"]) == (transport, framing, placement, size) \
                and row.get("executor", "preferred") != "global" and row.get("waitStrategy", "blocking") == "blocking" \
                and (handler is None or row.get("handler") == handler):
            return row


def span(values, form):
    return f"{form.format(min(values))}–{form.format(max(values))}" if values else "-"


print("| row | p50 before (µs) | p50 after | ÷ hand-off floor, before | after | ÷ same-work floor, before | after | context switches per round trip, before → after (median) |")
print("|---|---|---|---|---|---|---|---|")
placements = sorted({row["placement"] for rows in runs["after"] for row in rows if row["transport"] == "unix-socket"})
for transport, framing in (("unix-socket", "binary"), ("unix-socket", "http"), ("notify", None), ("message-port", None), ("file-presenter", None)):
    for placement in placements:
        for size in (64, 4096):
            cells = {}
            for version, files in runs.items():
                p50, handoff, work, switches = [], [], [], []
                for rows in files:
                    row = find(rows, transport, framing, placement, size, "task")
                    if row is None:
                        continue
                    p50.append(row["p50"] / 1000)
                    switches.append(row["localContextSwitchesPerRoundTrip"] + row["peerContextSwitchesPerRoundTrip"])
                    floor = find(rows, hand_off.get(transport, ""), None, placement, size) or find(rows, "floor:unix-stream+epoll+handoff", None, placement, size)
                    if floor:
                        handoff.append(row["p50"] / floor["p50"])
                    floors = [f["p50"] for f in (find(rows, name, None, placement, size) for name in same_work[transport]) if f]
                    if floors:
                        work.append(row["p50"] / min(floors))
                cells[version] = (p50, handoff, work, switches)
            b, a = cells["before"], cells["after"]
            name = f"{transport}{' ' + framing if framing else ''}, {placement}, {size} B"
            print(f"| {name} | {span(b[0], '{:.1f}')} | {span(a[0], '{:.1f}')} | {span(b[1], '{:.2f}')}× | {span(a[1], '{:.2f}')}× | "
                  f"{span(b[2], '{:.2f}')}× | {span(a[2], '{:.2f}')}× | {statistics.median(b[3]):.2f} → {statistics.median(a[3]):.2f} |")
