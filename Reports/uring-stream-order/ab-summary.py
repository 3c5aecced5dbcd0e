# Summary of alternated rounds of `ipcbench run` (old-1..N and new-1..N in DIR): each stream row's
# median messages a second (and range), and unix-socket's stream from the connection's executor
# as a share of the best event-driven floor (epoll or io_uring) in the same round.
#
#   python3 ab-summary.py DIR N
import json
import statistics
import sys

directory, rounds = sys.argv[1], int(sys.argv[2])


def streams(side, round):
    """The round's one-message-a-send blocking streams: {(name, placement, bytes): messages a second}."""
    rows = {}
    for row in json.load(open(f"{directory}/{side}-{round}/results.json"))["throughput"]:
        if row.get("batch") not in (None, 1) or row.get("waitStrategy") != "blocking":
            continue
        name = row["transport"]
        if name == "unix-socket" and (row.get("executor") != "preferred" or row.get("handler", "task") != "task"):
            continue
        if name != "unix-socket" and not name.startswith("floor:unix-stream"):
            continue
        rows[(name, row["placement"], row["payloadBytes"])] = row["messagesPerSecond"]
    return rows


runs = {side: [streams(side, round) for round in range(1, rounds + 1)] for side in ("old", "new")}
names = ["floor:unix-stream", "floor:unix-stream+epoll", "floor:unix-stream+io_uring", "unix-socket"]
for placement in ("same-core", "split-cores"):
    for size in (64, 4096, 65536, 1048576):
        print(f"{placement} {size}:")
        for name in names:
            values = {side: [run[(name, placement, size)] for run in runs[side] if (name, placement, size) in run] for side in runs}
            if not values["old"] or not values["new"]:
                continue
            print(f"   {name:28s}" + "".join(
                f"   {side} {statistics.median(v):>10,.0f} ({min(v):,.0f}–{max(v):,.0f})" for side, v in values.items()))
        for side in runs:
            shares, best = [], []
            for run in runs[side]:
                epoll, uring = run[("floor:unix-stream+epoll", placement, size)], run[("floor:unix-stream+io_uring", placement, size)]
                shares.append(run[("unix-socket", placement, size)] / max(epoll, uring))
                best.append("io_uring" if uring >= epoll else "epoll")
            print(f"   unix-socket ÷ best event-driven floor, {side}: {statistics.median(shares) * 100:.0f} % (best: {', '.join(best)})")
