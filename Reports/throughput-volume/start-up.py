#!/usr/bin/env python3
"""Start-up cost of the measured stream repetitions in FILE... (lines `MARKS size=S n=N t1,...,tN report=T`,
microseconds from the repetition's start to each send's return and to the peer's report, written by
ipcbench built with start-up-marks.patch and run with TP_MARKS=1, or by start-up-client/main.swift).

Lines of fewer than 20 messages (the warm-up streams') are skipped. For each repetition: the steady rate is the time per message over its second half (marks N/2 to N);
the start-up excess is the whole time minus N such messages. Prints the medians over all
repetitions of every file: the first 10 messages, a steady message, the report's wait after the last
send, and the excess (which includes that wait).
"""
import re, statistics, sys

first, steady, report, excess = [], [], [], []
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r'MARKS size=\d+ n=(\d+) (\S+) report=(\d+)', line)
        if not m:
            continue
        n, marks, total = int(m.group(1)), [int(x) for x in m.group(2).split(',')], int(m.group(3))
        if n < 20 or len(marks) != n:
            continue  # a warm-up stream, or a line cut short
        half = n // 2
        per = (marks[n - 1] - marks[half - 1]) / (n - half)
        first.append(marks[9]); steady.append(per); report.append(total - marks[-1]); excess.append(total - n * per)
med = statistics.median
print(f"repetitions {len(first)}: first 10 messages {med(first):.0f} us (10 steady ones {10 * med(steady):.0f}), "
      f"a steady message {med(steady):.1f} us, report after the last send {med(report):.0f} us, "
      f"excess over N steady messages {med(excess):.0f} us (range {min(excess):.0f} to {max(excess):.0f})")
