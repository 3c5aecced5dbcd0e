#!/usr/bin/env bash
# Runs the benchmark package (Benchmarks/) and writes everything under one folder,
# Reports/benchmarks/<UTC date and time>/ unless --output names another:
#   package-benchmark.md          framing and secure-decoding suites: every metric, per operation
#   package-benchmark.jmh.json    the same as JMH JSON, without the raw samples (figures per
#                                 outer iteration: 1000 operations where a benchmark scales)
#   thresholds-check.txt          malloc counts checked against Benchmarks/Thresholds/<Swift x.y>
#   instructions.json, .md        instructions per round trip between two processes (callgrind),
#                                 checked against Benchmarks/Thresholds/instructions-<Swift x.y>.json,
#                                 and per message of a one-way stream (not checked)
#   floor-crosscheck-N.json       the native floor timed by Google Benchmark, round N (its
#                                 compare.py reads these)
#   ipcbench-floor-N/results.json the same floor timed by ipcbench (`ipcbench floor`), round N
#   summary.md                    p50 and mallocs per operation; the two floors side by side
# Exits non-zero if an allocation count or an instruction count regressed past its threshold.
#
# Options: --quick        one round of the floor, with a tenth of ipcbench's samples, one pair
#                         of callgrind runs per instruction count instead of three, and each
#                         package-benchmark benchmark for 0.2 s instead of 1 s
#                         (IPCBENCH_BENCHMARKS_QUICK=1)
#          --floor-only   skip the package-benchmark suites
#          --output DIR
# Refresh the thresholds after an intended change (from Benchmarks/):
#   swift package --allow-writing-to-package-directory benchmark thresholds update \
#       --path Thresholds/<Swift x.y> --metric mallocCountTotal
# and the instruction counts (from the top of the repository):
#   Scripts/instructions.sh --update Benchmarks/Thresholds/instructions-<Swift x.y>.json
set -euo pipefail
cd "$(dirname "$0")/.."

quick=false floor_only=false output=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=true ;;
        --floor-only) floor_only=true ;;
        --output)
            [ $# -ge 2 ] || { echo "benchmarks.sh: --output needs a value" >&2; exit 64; }
            output="$2"; shift ;;
        *) echo "usage: $0 [--quick] [--floor-only] [--output DIR]" >&2; exit 64 ;;
    esac
    shift
done

Scripts/install-system-packages.sh
[ "$quick" = false ] || export IPCBENCH_BENCHMARKS_QUICK=1
output=${output:-Reports/benchmarks/$(date -u +%Y-%m-%dT%H%M%SZ)}
mkdir -p "$output"
output=$(cd "$output" && pwd)
swift_version=$(swift --version 2>/dev/null | sed -n 's/.*Swift version \([0-9]*\.[0-9]*\).*/\1/p' | head -n 1)
summary="$output/summary.md"
: > "$summary"
thresholds_status=0

if [ "$floor_only" = false ]; then
    echo "== package-benchmark suites (Benchmarks/, release build)" >&2
    (
        cd Benchmarks
        # One run, stored as the baseline 'current'; the outputs are read from it.
        swift package --allow-writing-to-package-directory benchmark baseline update current --no-progress --quiet
        swift package benchmark baseline read current --format markdown --path stdout --no-progress 2>/dev/null > "$output/package-benchmark.md"
        swift package --allow-writing-to-directory "$output" benchmark baseline read current --format jmh --path "$output" --no-progress > /dev/null
        python3 summarize.py compact-jmh "$output/current.jmh.json" > "$output/package-benchmark.jmh.json"
        rm "$output/current.jmh.json"
    )
    set +e
    (cd Benchmarks && swift package benchmark thresholds check current --path "Thresholds/$swift_version" --no-progress) > "$output/thresholds-check.txt" 2>&1
    thresholds_status=$?
    set -e
    {
        echo "## In process (package-benchmark), Swift $swift_version"
        echo
        python3 Benchmarks/summarize.py package-benchmark "$output/package-benchmark.md"
        echo
    } >> "$summary"
fi

echo "== instructions per round trip, both processes (callgrind)" >&2
instruction_pairs=3
[ "$quick" = false ] || instruction_pairs=1
set +e
Scripts/instructions.sh --stream --pairs "$instruction_pairs" --output "$output" --check "Benchmarks/Thresholds/instructions-$swift_version.json" > /dev/null
instructions_status=$?
set -e
{
    echo "## Instructions per round trip, and per message of the one-way stream (callgrind, user space, both processes; Scripts/instructions.sh --stream)"
    echo
    if [ -f "$output/instructions.md" ]; then cat "$output/instructions.md"; else echo "Scripts/instructions.sh failed (status $instructions_status) before it counted: see its output above"; fi
    echo
} >> "$summary"

echo "== native floor: Google Benchmark and ipcbench, in alternating rounds" >&2
# Alternating rounds, so that both tools meet the same drift of a shared machine.
rounds=3 min_time=0.2 sample_scale=1
if [ "$quick" = true ]; then rounds=1 min_time=0.05 sample_scale=0.1; fi
make -s -C Benchmarks/FloorCrossCheck
swift build -c release --product ipcbench
for round in $(seq "$rounds"); do
    echo "-- round $round of $rounds" >&2
    Benchmarks/.build/floor-crosscheck/floor-crosscheck --benchmark_min_time="$min_time" \
        --benchmark_out="$output/floor-crosscheck-$round.json" --benchmark_out_format=json >&2
    .build/release/ipcbench floor --sample-scale "$sample_scale" --output "$output/ipcbench-floor-$round" > /dev/null
done
{
    echo "## Native floor: Google Benchmark and ipcbench, medians over $rounds alternating rounds"
    echo
    python3 Benchmarks/summarize.py floor "$output"
} >> "$summary"

cat "$summary"
echo "wrote $output" >&2
case "$instructions_status" in
    0) ;;
    1) echo "instructions per round trip regressed past their thresholds (Benchmarks/Thresholds/instructions-$swift_version.json): see above" >&2; exit 1 ;;
    3) echo "no instruction thresholds for Swift $swift_version: make them with Scripts/instructions.sh --update Benchmarks/Thresholds/instructions-$swift_version.json" >&2 ;;
    *) echo "Scripts/instructions.sh failed (status $instructions_status): see its output above" >&2; exit 1 ;;
esac
# The benchmark plugin stops at the first suite that is off its thresholds either way and exits 1
# (its tool's own 4, an improvement, becomes the plugin's error), so an improvement fails too:
# the suites after it were not checked.
case "$thresholds_status" in
    0) ;;
    *)
        if grep -q 'benchmarkThresholdImprovement' "$output/thresholds-check.txt"; then
            echo "allocation counts improved on their thresholds (the suites after that one were not checked): update them (see the top of this script); $output/thresholds-check.txt" >&2
        else
            echo "allocation counts regressed past their thresholds: see $output/thresholds-check.txt" >&2
        fi
        exit 1 ;;
esac
