#!/usr/bin/env bash
# Builds the libFuzzer targets of Fuzz/ with coverage and AddressSanitizer, checks that the code
# under test really is instrumented, and runs each target for SECONDS_PER_TARGET (default 60) with
# its committed seed corpus and dictionary, then replays everything it kept with leak detection.
#
#   Scripts/fuzz.sh [--jobs N] [SECONDS_PER_TARGET] [TARGET...]
#
# --jobs N runs N targets at a time (default: the number of CPUs). Each target is one libFuzzer
# process on one thread, so each still gets its SECONDS_PER_TARGET of one CPU; the summary lines
# come in the targets' order whatever order they finish in.
#
# New corpus entries go to Fuzz/.build/fuzz-corpus/<target>/ (kept between runs, never into the
# committed Fuzz/Corpus/); logs to Fuzz/.build/fuzz-logs/, the summary to Fuzz/.build/fuzz-report.txt.
# A crash, leak, timeout or out-of-memory saves the input as Fuzz/Crashes/<target>-<kind>-<sha1>
# and makes the script exit non-zero after the other targets ran. Replay one with
# `Fuzz/.build/release/<target> <file>`; once understood, keep it under
# Tests/Fixtures/fuzz-regressions/ so that the test suite replays it.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc 2>/dev/null || echo 1)
if [ "${1:-}" = "--jobs" ]; then
    [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs needs a positive whole number" >&2; exit 64; }
    jobs=$2
    shift 2
fi
seconds=${1:-60}
shift || true
all_targets=(
    FuzzBinaryFrameDecoder
    FuzzHTTPFrameDecoder
    FuzzReassemblyOracle
    FuzzJSONPayload
    FuzzPropertyListPayload
    FuzzKeyedArchivePayload
    FuzzBinaryCodablePayload
)
targets=()
for target in "${@:-${all_targets[@]}}"; do
    # Once each: two jobs of one target would share its log, corpus and status.
    [[ " ${targets[*]} " == *" $target "* ]] || targets+=("$target")
done

# Targets whose inputs mostly reach a known, suppressed leak (Fuzz/lsan-suppressions.txt). libFuzzer
# runs LeakSanitizer after every input that leaks, which would slow these twentyfold, so they fuzz
# without leak checks, in segments short enough that the known leak cannot reach the RSS limit;
# the replay below still checks every input they kept for leaks.
leaky_targets=" FuzzKeyedArchivePayload "
segment_seconds=120

fail() {
    echo "fuzz.sh: $*" >&2
    exit 1
}

# --sanitize=fuzzer alone links libFuzzer without instrumenting the Swift code; the -Xswiftc flag
# adds the coverage counters libFuzzer is guided by, and AddressSanitizer.
build=(swift build -c release --sanitize=fuzzer -Xswiftc -sanitize=fuzzer,address)
(cd Fuzz && "${build[@]}")
bin=$(cd Fuzz && "${build[@]}" --show-bin-path)

# Every object file of the modules under test carries coverage counters and ASan checks. (grep -c
# reads all its input: grep -q would close the pipe early, which pipefail reports as a failure.)
for module in IPCCore IPCFraming IPCSecureCoding FuzzSupport; do
    objects=("$bin/$module.build/"*.o)
    [ -e "${objects[0]}" ] || fail "no object files for $module in $bin"
    for object in "${objects[@]}"; do
        objdump -h "$object" | grep -c __sancov_cntrs >/dev/null || fail "$object has no coverage counters (__sancov_cntrs): not built with -sanitize=fuzzer"
    done
    nm -u "${objects[@]}" | grep -c __asan_report >/dev/null || fail "$module calls no __asan_report_*: not built with -sanitize=address"
done

# libFuzzer reports crashes itself; Swift's backtracer would run inside the crashing, ASan-checked
# process, trip ASan and can outlive it.
export SWIFT_BACKTRACE=enable=no
# Leaks outside this repository that the fuzzer found and that were reported; see the file.
export LSAN_OPTIONS="suppressions=$PWD/Fuzz/lsan-suppressions.txt${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

mkdir -p Fuzz/Crashes Fuzz/.build/fuzz-logs
report=Fuzz/.build/fuzz-report.txt
: >"$report"
failed=()

# Runs libFuzzer on a target; appends its output to the target's log and returns its status.
run() {
    local target=$1 log=$2
    shift 2
    # The first corpus directory receives new entries; the committed one is only read.
    "$bin/$target" "Fuzz/.build/fuzz-corpus/$target" "Fuzz/Corpus/$target" \
        -dict="Fuzz/Dictionaries/$target.dict" -rss_limit_mb=2048 -timeout=10 -max_len=8192 \
        -artifact_prefix="Fuzz/Crashes/$target-" -print_final_stats=1 "$@" >>"$log" 2>&1
}

for target in "${targets[@]}"; do
    [ -x "$bin/$target" ] || fail "no fuzz target $target (targets: ${all_targets[*]})"
    nm "$bin/$target" | grep -c __sanitizer_cov_8bit_counters_init >/dev/null || fail "$target does not link the coverage runtime"
done

# Fuzzes one target, then writes its summary line (and, if it failed, what failed) to
# fuzz-logs/<target>.summary and its exit status to fuzz-logs/<target>.status. Runs in a
# background job: it never writes the shared report itself.
fuzz_target() {
    local target=$1 status=0 started=$SECONDS left segment elapsed
    local log=Fuzz/.build/fuzz-logs/$target.log summary=Fuzz/.build/fuzz-logs/$target.summary
    mkdir -p "Fuzz/.build/fuzz-corpus/$target"
    : >"$log"
    : >"$summary"
    echo "=== $target: $seconds s"

    if [[ $leaky_targets == *" $target "* ]]; then
        left=$seconds
        while [ "$left" -gt 0 ] && [ "$status" -eq 0 ]; do
            segment=$((left < segment_seconds ? left : segment_seconds))
            run "$target" "$log" -max_total_time="$segment" -detect_leaks=0 || status=$?
            left=$((left - segment))
        done
    else
        run "$target" "$log" -max_total_time="$seconds" || status=$?
    fi
    elapsed=$((SECONDS - started > 0 ? SECONDS - started : 1))

    counters=$(sed -n 's/^INFO: Loaded [0-9]* modules *(\([0-9]*\) inline 8-bit counters).*/\1/p' "$log" | head -n 1)
    [ "${counters:-0}" -gt 0 ] || fail "$target reported no inline 8-bit counters: the build is not coverage-instrumented (see $log)"
    final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | awk '{ n += $1 } END { print n }')
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | sort -n | tail -n 1)
    cov=$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' <<<"$final")
    ft=$(sed -n 's/.* ft: \([0-9]*\) .*/\1/p' <<<"$final")
    corpus=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\) .*/\1/p' <<<"$final")

    # Everything kept, replayed once with leak detection on.
    if [ "$status" -eq 0 ]; then
        echo "--- leak check: replaying the corpus" >>"$log"
        run "$target" "$log" -runs=0 -detect_leaks=1 || status=$?
    fi

    printf '%-24s %5ss  execs %9s  exec/s %6s  cov %5s  ft %6s  corpus %-11s  counters %5s  peak rss %sMb\n' \
        "$target" "$elapsed" "${runs:-0}" "$(( ${runs:-0} / elapsed ))" "${cov:-?}" "${ft:-?}" "${corpus:-?}" "$counters" "${rss:-?}" >>"$summary"

    artifacts=$(ls Fuzz/Crashes/"$target"-* 2>/dev/null || true)
    if [ "$status" -ne 0 ] || [ -n "$artifacts" ]; then
        [ "$status" -ne 0 ] || status=1
        echo "$target FAILED (exit $status); log: $log; inputs: ${artifacts:-none}" >>"$summary"
        grep -E '==ERROR|^SUMMARY|Fatal error|Precondition failed|deadly signal|timeout|out-of-memory' "$log" | head -n 5 >>"$summary" || true
        # A timeout is measured in wall time, so a stalled machine can cause one: say how long the
        # input takes now, to tell a slow input from a stall. It still fails the run.
        for input in Fuzz/Crashes/"$target"-timeout-*; do
            [ -e "$input" ] || continue
            "$bin/$target" -timeout=10 "$input" 2>&1 | grep -E '^Executed|ERROR' | sed "s|^|replay: |" >>"$summary" || true
        done
    fi
    echo "$status" >"Fuzz/.build/fuzz-logs/$target.status"
}

rm -f Fuzz/.build/fuzz-logs/*.status Fuzz/.build/fuzz-logs/*.summary
# Jobs still fuzzing when the script ends early (interrupted, or a failure here) are stopped.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
for target in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    # The job's own errors (a check of its run that fails ends it) go to its log.
    fuzz_target "$target" 2>>"Fuzz/.build/fuzz-logs/$target.log" &
done
wait

# The summaries in the targets' order; a target without a status ended early (its failure is at
# the end of its log).
for target in "${targets[@]}"; do
    summary=Fuzz/.build/fuzz-logs/$target.summary
    [ -s "$summary" ] && tee -a "$report" <"$summary"
    status=$(cat "Fuzz/.build/fuzz-logs/$target.status" 2>/dev/null || echo "none")
    if [ "$status" != 0 ]; then
        [ "$status" != none ] || echo "$target FAILED: it ended without a status; see Fuzz/.build/fuzz-logs/$target.log" | tee -a "$report"
        failed+=("$target")
    fi
done

echo "report: $report"
[ ${#failed[@]} -eq 0 ] || fail "failed targets: ${failed[*]}"
