#!/usr/bin/env python3
"""Summaries for Scripts/benchmarks.sh, as Markdown on standard output.

  summarize.py package-benchmark RESULTS.md
      p50 time and allocations per operation of every package-benchmark benchmark (read from
      the Markdown that `swift package benchmark baseline read --format markdown` writes, whose
      figures are per operation even where a benchmark runs an inner loop), and GB/s for framing.
  summarize.py compact-jmh JMH.json
      package-benchmark's JMH export without its raw samples (every measurement, megabytes),
      keeping the percentiles and scores.
  summarize.py floor DIRECTORY
      the native floor as Google Benchmark (DIRECTORY/floor-crosscheck-*.json) and as ipcbench
      (DIRECTORY/ipcbench-floor-*/results.json) measured it in alternating rounds, side by side:
      per tool the median over the rounds of each round's p50 (and of Google Benchmark's mean).
"""
import glob
import json
import os
import re
import statistics
import sys

TIME_UNITS = {"ns": 1.0, "μs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
SIZE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def package_benchmark(path):
    rows, target, current = [], None, None
    with open(path, encoding="utf-8") as markdown:
        for line in markdown:
            if line.startswith("## "):
                target = line[3:].strip()
            elif line.startswith("### "):
                current = {"target": target, "name": line[4:].strip()}
                rows.append(current)
            elif line.startswith("| ") and current is not None:
                cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
                label, p50 = cells[0], cells[3]
                unit = re.search(r"\((ns|μs|us|ms|s)\)", label)
                if label.startswith("Time (wall clock)") and unit:
                    current["ns"] = float(p50) * TIME_UNITS[unit.group(1)]
                elif label.startswith("Malloc (total)"):
                    current["mallocs"] = p50
    print("| suite | benchmark | p50 ns/op | mallocs/op (p50) | GB/s at p50 |")
    print("|:--|:--|--:|--:|--:|")
    for row in rows:
        size = re.search(r"(\d+)(B|KiB|MiB)$", row["name"])
        rate = ""
        if row["target"] == "FramingBenchmarks" and size and "ns" in row:
            rate = f"{int(size.group(1)) * SIZE_UNITS[size.group(2)] / row['ns']:.2f}"
        print(f"| {row['target']} | {row['name']} | {row.get('ns', float('nan')):,.0f} | {row.get('mallocs', '')} | {rate} |")


def floor(directory):
    google, ipcbench = {}, {}
    for path in sorted(glob.glob(os.path.join(directory, "floor-crosscheck-*.json"))):
        with open(path, encoding="utf-8") as file:
            for entry in json.load(file)["benchmarks"]:
                if entry.get("run_type") != "iteration" or entry.get("error_occurred"):
                    continue
                _, mechanism, placement, size = entry["run_name"].split("/")[:4]
                google.setdefault((mechanism, placement, int(size)), []).append(entry)
    for path in sorted(glob.glob(os.path.join(directory, "ipcbench-floor-*", "results.json"))):
        with open(path, encoding="utf-8") as file:
            for result in json.load(file)["latency"]:
                key = (result["transport"].removeprefix("floor:"), result["placement"], result["payloadBytes"])
                ipcbench.setdefault(key, []).append(result["p50"] / 1000)
    print("| mechanism | placement | payload | Google Benchmark p50 µs | Google Benchmark mean µs | ipcbench p50 µs | ipcbench / Google Benchmark |")
    print("|:--|:--|--:|--:|--:|--:|--:|")
    for key in sorted(set(google) & set(ipcbench)):
        google_p50 = statistics.median(run["p50_us"] for run in google[key])
        google_mean = statistics.median(run["real_time"] for run in google[key])
        ipcbench_p50 = statistics.median(ipcbench[key])
        print(f"| {key[0]} | {key[1]} | {key[2]} | {google_p50:.1f} | {google_mean:.1f} | {ipcbench_p50:.1f} | {ipcbench_p50 / google_p50:.2f} |")


def compact_jmh(path):
    with open(path, encoding="utf-8") as file:
        elements = json.load(file)
    for element in elements:
        for metric in [element["primaryMetric"], *element.get("secondaryMetrics", {}).values()]:
            metric.pop("rawData", None)
    json.dump(elements, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "package-benchmark":
        package_benchmark(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "compact-jmh":
        compact_jmh(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "floor":
        floor(sys.argv[2])
    else:
        sys.exit(__doc__)
