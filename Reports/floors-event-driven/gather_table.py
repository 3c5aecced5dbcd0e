#!/usr/bin/env python3
"""The write-gathering comparison (issue 32, throughput): for each run's results.json, the
unix-socket binary streams as a share of the best event-driven C stream of the same run
(the faster of floor:unix-stream+epoll and floor:unix-stream+io_uring, one message a write),
and that stream's share of the blocking floor:unix-stream; where the run has it, the batched
row as a share of its same-work floor, floor:unix-stream+epoll batched by 8 (key
"floor:unix-stream+epoll/batched-8"). Prints the median and the range over the runs given.

    python3 gather_table.py label=PATH [label=PATH ...]   (runs with the same label are pooled;
    PATH a results.json, or a run's output directory)
"""
import json
import statistics
import sys

ROWS = [("task", "per message, connection's executor"), ("on-loop", "per message, on-loop handler peer"), ("batched-8", "batched by 8 (send(contentsOf:))")]


def rows(path):
    results = json.load(open(path if path.endswith(".json") else path + "/results.json"))
    out = {}
    for row in results.get("throughput", []):
        name = row["transport"]
        if name == "unix-socket":
            name = "batched-%d" % row["batch"] if row.get("batch") else ("on-loop" if row.get("handler") == "on-loop" else "task")
        elif row.get("batch"):
            # A floor's batched stream: not the floor's per-message row.
            name += "/batched-%d" % row["batch"]
        out[(name, row["placement"], row["payloadBytes"])] = row["messagesPerSecond"]
    return out


def span(values):
    if not values:
        return "-"
    return "%.0f %% (%.0f–%.0f)" % (statistics.median(values), min(values), max(values))


runs = {}
for argument in sys.argv[1:]:
    label, path = argument.split("=", 1)
    runs.setdefault(label, []).append(rows(path))
sizes = [64, 4096, 65536]
for placement in ["same-core", "split-cores"]:
    print("\n%s: share of the best event-driven C stream of the same run, median (range)\n" % placement)
    print("| row | " + " | ".join("%d B" % s for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for label, results in runs.items():
        for key, title in ROWS:
            cells = []
            for size in sizes:
                values = []
                for run in results:
                    best = max(run.get(("floor:unix-stream+epoll", placement, size), 0), run.get(("floor:unix-stream+io_uring", placement, size), 0))
                    value = run.get((key, placement, size))
                    if value and best:
                        values.append(100 * value / best)
                cells.append(span(values))
            if any(c != "-" for c in cells):
                print("| %s: %s | " % (label, title) + " | ".join(cells) + " |")
        cells = []
        for size in sizes:
            values = []
            for run in results:
                best = max(run.get(("floor:unix-stream+epoll", placement, size), 0), run.get(("floor:unix-stream+io_uring", placement, size), 0))
                blocking = run.get(("floor:unix-stream", placement, size))
                if best and blocking:
                    values.append(100 * best / blocking)
            cells.append(span(values))
        print("| %s: best event-driven ÷ blocking floor | " % label + " | ".join(cells) + " |")
        cells = []
        for size in sizes:
            values = []
            for run in results:
                batched = run.get(("batched-8", placement, size))
                floor = run.get(("floor:unix-stream+epoll/batched-8", placement, size))
                if batched and floor:
                    values.append(100 * batched / floor)
            cells.append(span(values))
        if any(c != "-" for c in cells):
            print("| %s: batched by 8 ÷ epoll floor batched by 8 (its same work) | " % label + " | ".join(cells) + " |")
    print("\n%s: messages/s, median (range)\n" % placement)
    print("| row | " + " | ".join("%d B" % s for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for label, results in runs.items():
        for key in ["task", "on-loop", "batched-8", "floor:unix-stream", "floor:unix-stream+epoll", "floor:unix-stream+io_uring", "floor:unix-stream+epoll/batched-8"]:
            cells = []
            for size in sizes:
                values = [run[(key, placement, size)] / 1e3 for run in results if (key, placement, size) in run]
                cells.append("%.0f k (%.0f–%.0f)" % (statistics.median(values), min(values), max(values)) if values else "-")
            if any(c != "-" for c in cells):
                print("| %s: %s | " % (label, key) + " | ".join(cells) + " |")
