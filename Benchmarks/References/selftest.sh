#!/usr/bin/env bash
# Self-test of the built reference systems (run build.sh first). For every system whose binary
# is in .build/bin: serve in a fresh directory, measure latency and throughput for payloads of 0,
# 64, 65536 and 1048576 bytes with small counts and check the JSON line's shape with python3;
# check that a wrong echo (serve --corrupt) and a wrong one-way message (measure --corrupt) each
# make measure exit 3, and that a missing server does too, at once; then stop the server (once by
# closing its stdin, once by SIGTERM) and check that its sockets, and any daemon, are gone, and
# that the system left nothing in /dev/shm, /dev/mqueue or /tmp (iceoryx's RouDi and runtimes
# put their sockets, locks and shared memory there).
# Exits non-zero on any failure; the last line is "N passed, M failed".
#
#   Benchmarks/References/selftest.sh [--system NAME]...
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/.build/bin"
all_systems=(ref-zmq:zmq-reqrep ref-zmq:zmq-pushpull ref-dbus:dbus-daemon ref-dbus:dbus-p2p ref-grpc-cpp:grpc-cpp ref-nio:nio ref-grpc:grpc
    ref-iceoryx:iceoryx ref-iceoryx:iceoryx-spin)
only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --system)
            [ $# -ge 2 ] || { echo "selftest.sh: --system needs a value" >&2; exit 2; }
            only+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "selftest.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "  ok    $*"; }
fail() { failed=$((failed + 1)); echo "  FAIL  $*"; }

server_cpu=()
client_cpu=()
if [ "$(nproc)" -ge 2 ]; then server_cpu=(--cpu 0); client_cpu=(--cpu 1); fi

# check_json FILE MODE SYSTEM PAYLOAD COUNT: the one JSON line of measure, and the median if latency.
# CPU fields must be positive, but for a spinning system's server (see below).
check_json() {
    python3 - "$@" <<'PY'
import json, sys
path, mode, system, payload, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# A server that spins without leaving its CPU has its CPU time brought up to date only at
# scheduler ticks (C/ref_common.h): over a section shorter than a tick it can read 0.
server_cpu_minimum = 0 if system.endswith("-spin") else 1
lines = open(path).read().splitlines()
def bad(why):
    print(why); sys.exit(1)
if len(lines) != 1: bad(f"{len(lines)} lines on stdout, expected exactly 1")
try: result = json.loads(lines[0])
except ValueError as error: bad(f"not JSON: {error}")
def integer(key, minimum):
    value = result.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        bad(f"{key} = {value!r}, expected an integer >= {minimum}")
    return value
keys = {"mode", "system", "payload", "clientCPUNs", "serverCPUNs", "clientVoluntarySwitches",
        "clientInvoluntarySwitches", "serverVoluntarySwitches", "serverInvoluntarySwitches"}
keys |= {"samplesNs"} if mode == "latency" else {"messages", "elapsedNs"}
if set(result) != keys: bad(f"keys {sorted(result)}, expected {sorted(keys)}")
if result["mode"] != mode or result["system"] != system: bad(f"mode/system {result['mode']}/{result['system']}")
if integer("payload", 0) != payload: bad(f"payload {result['payload']}, expected {payload}")
integer("clientCPUNs", 1); integer("serverCPUNs", server_cpu_minimum)
for side in ("client", "server"):
    integer(side + "VoluntarySwitches", 0); integer(side + "InvoluntarySwitches", 0)
if mode == "latency":
    samples = result["samplesNs"]
    if not isinstance(samples, list) or len(samples) != count: bad(f"{len(samples)} samples, expected {count}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in samples): bad("a sample is not a positive integer")
    ordered = sorted(samples)
    print(f"median {ordered[len(ordered) // 2] / 1000:.1f} us")
else:
    if integer("messages", 1) != count: bad(f"messages {result['messages']}, expected {count}")
    elapsed = integer("elapsedNs", 1)
    print(f"{count / (elapsed / 1e9):.0f} msg/s")
PY
}

# start_server BINARY SYSTEM ADDRESS WORK [--corrupt]: starts serve with stdin on a pipe held open
# by this shell (fd in server_stdin), waits for 'ready'; sets server_pid, or start_error and
# returns 1. Not to be called in a subshell: the pipe must stay open in this shell.
start_server() {
    local binary="$1" system="$2" address="$3" work="$4"; shift 4
    # serve.out is made afresh: the shell truncates it only in the child, after the child has
    # opened the pipe, so a previous server's 'ready' could otherwise be read as this one's.
    rm -f "$work/stdin" "$work/serve.out" "$work/serve.err"; mkfifo "$work/stdin"
    # Descriptor 7, a file of the work directory, stands for what the harness's Process gives
    # serve beyond its standard streams: no daemon serve starts may hold it (README, "Descriptors").
    "$bin/$binary" serve --system "$system" --address "$address" "${server_cpu[@]}" "$@" \
        <"$work/stdin" >"$work/serve.out" 2>"$work/serve.err" 7>"$work/inherited" &
    server_pid=$!
    exec {server_stdin}>"$work/stdin"
    local waited=0
    until grep -qx ready "$work/serve.out" 2>/dev/null; do
        if ! kill -0 "$server_pid" 2>/dev/null || [ "$waited" -ge 300 ]; then
            start_error="serve did not print ready: $(tr '\n' ' ' <"$work/serve.err")"
            return 1
        fi
        sleep 0.1; waited=$((waited + 1))
    done
    [ "$(cat "$work/serve.out")" = ready ] || { start_error="serve printed more than 'ready'"; return 1; }
}

# wait_exit PID SECONDS: waits for a child; sets exit_status (or returns 1 on time-out).
wait_exit() {
    local pid="$1" limit=$(( $2 * 10 )) waited=0
    while kill -0 "$pid" 2>/dev/null; do
        [ "$waited" -ge "$limit" ] && return 1
        sleep 0.1; waited=$((waited + 1))
    done
    wait "$pid"; exit_status=$?
}

# check_cleaned_up WHERE WHEN: once serve has exited, nothing is left in the address directory
# (checks named "... WHERE") and the daemon (dbus-daemon, iceoryx's RouDi), if there was one, is
# gone ("...WHEN").
check_cleaned_up() {
    local where="$1" when="$2" left
    left="$(ls -A "$address")"
    if [ -z "$left" ]; then pass "nothing left $where"; else fail "left $where: $left"; fi
    if [ -n "$daemon_pid" ]; then
        sleep 0.2
        if kill -0 "$daemon_pid" 2>/dev/null; then fail "daemon $daemon_pid still running$when"; kill "$daemon_pid"
        else pass "daemon $daemon_pid is gone$when"; fi
    fi
}

# The daemon a server started: its pid file in the address directory, if any.
read_daemon_pid() {
    daemon_pid=""
    local file
    for file in "$address/dbus-daemon.pid" "$address/iox-roudi.pid"; do
        [ -f "$file" ] && daemon_pid="$(cat "$file")"
    done
    return 0
}

# Machine-wide places a system could leave something in: their entries now, one a line.
machine_listing() {
    { find /dev/shm /dev/mqueue -mindepth 1 -maxdepth 1 -printf '%p\n' 2>/dev/null
      find "${TMPDIR:-/tmp}" /tmp -mindepth 1 -maxdepth 1 -printf '%p\n' 2>/dev/null; } | sort -u
}

# check_nothing_left_on_machine BEFORE: what is in /dev/shm, /dev/mqueue and /tmp now and was not
# in the listing BEFORE. Anything new in /dev/shm or /dev/mqueue fails, and so does anything new
# in /tmp that a reference names (iceoryx: roudi, roudi.lock, iox-unique-roudi.lock, and its
# runtimes' ipcbench-iox-*); other new entries of /tmp are listed, not counted, as other
# processes of the machine use /tmp too.
check_nothing_left_on_machine() {
    local before="$1" new counted other
    new="$(machine_listing | comm -13 "$before" - | grep -v "^$work" || true)"
    counted="$(grep -E '^/dev/(shm|mqueue)/|^/tmp/(roudi|roudi\.lock|iox-unique-roudi\.lock|ipcbench-iox-.*)$' <<< "$new" || true)"
    other="$(grep -v -x -F -f <(printf '%s\n' "$counted") <<< "$new" | grep . || true)"
    if [ -z "$counted" ]; then pass "nothing left in /dev/shm, /dev/mqueue or /tmp"
    else fail "left on the machine: $(tr '\n' ' ' <<< "$counted")"; fi
    [ -z "$other" ] || echo "  note  new in /tmp meanwhile, not counted (other processes use it too): $(tr '\n' ' ' <<< "$other" | cut -c1-300)"
}

for entry in "${all_systems[@]}"; do
    binary="${entry%%:*}" system="${entry#*:}"
    if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " =~ " $system " ]]; then continue; fi
    if [ ! -x "$bin/$binary" ]; then echo "$system: skipped ($binary not built)"; continue; fi
    echo "$system ($binary)"
    machine_before="$(mktemp /tmp/ipcbench-ref-listing.XXXXXX)"
    machine_listing > "$machine_before"
    work="$(mktemp -d /tmp/ipcbench-ref.XXXXXX)"
    address="$work/a"; mkdir "$address"
    if ! start_server "$binary" "$system" "$address" "$work"; then
        fail "$system: serve: $start_error"; kill "$server_pid" 2>/dev/null; exec {server_stdin}>&-; rm -rf "$work" "$machine_before"; continue
    fi
    read_daemon_pid
    if [ -n "$daemon_pid" ]; then
        if find /proc/"$daemon_pid"/fd -lname "$work/inherited" 2>/dev/null | grep -q .; then
            fail "daemon $daemon_pid holds a descriptor serve inherited (README, \"Descriptors\")"
        else
            pass "daemon $daemon_pid holds none of the descriptors serve inherited"
        fi
    fi

    # measure MODE PAYLOAD WARMUP COUNT [extra...]: sets status and leaves out/err in $work.
    measure() {
        local mode="$1" payload="$2" warmup="$3" count="$4"; shift 4
        timeout 120 "$bin/$binary" measure --system "$system" --address "$address" --server-pid "$server_pid" \
            --mode "$mode" --payload "$payload" --warmup "$warmup" --count "$count" "${client_cpu[@]}" "$@" \
            >"$work/measure.out" 2>"$work/measure.err"
        status=$?
    }

    for mode in latency throughput; do
        for payload in 0 64 65536 1048576; do
            if [ "$mode" = latency ]; then warmup=5 count=50; else warmup=20 count=300; fi
            if [ "$payload" = 1048576 ]; then warmup=2 count=10; [ "$mode" = throughput ] && count=30; fi
            measure "$mode" "$payload" "$warmup" "$count"
            label="$mode $payload B x $count"
            if [ "$status" = 4 ] && [ "$(wc -l <"$work/measure.err")" = 1 ] && [ ! -s "$work/measure.out" ]; then
                pass "$label: unsupported (exit 4): $(cat "$work/measure.err")"
            elif [ "$status" != 0 ]; then
                fail "$label: exit $status: $(tr '\n' ' ' <"$work/measure.err")"
            elif summary="$(check_json "$work/measure.out" "$mode" "$system" "$payload" "$count")"; then
                pass "$label: $summary"
            else
                fail "$label: $summary"
            fi
        done
    done

    # A wrong one-way message must be caught by the receiver and reported to the sender.
    measure throughput 64 0 100 --corrupt
    if [ "$status" = 3 ] && [ "$(wc -l <"$work/measure.err")" = 1 ] && [ ! -s "$work/measure.out" ]; then
        pass "measure --corrupt: exit 3: $(cat "$work/measure.err")"
    elif [ "$status" = 4 ]; then
        pass "measure --corrupt: throughput unsupported (exit 4)"
    else
        fail "measure --corrupt: exit $status (expected 3 and one stderr line): $(tr '\n' ' ' <"$work/measure.err")"
    fi

    # A missing server: exit 3 at once.
    empty="$work/empty"; mkdir "$empty"
    started=$(date +%s)
    timeout 30 "$bin/$binary" measure --system "$system" --address "$empty" --server-pid "$server_pid" \
        --mode latency --payload 64 --warmup 0 --count 1 >"$work/measure.out" 2>"$work/measure.err"
    status=$?
    if [ "$status" = 3 ] && [ $(( $(date +%s) - started )) -le 2 ]; then
        pass "no server: exit 3: $(cat "$work/measure.err")"
    else
        fail "no server: exit $status after $(( $(date +%s) - started )) s (expected 3 at once)"
    fi

    if [ "$binary" = ref-iceoryx ]; then
        # Above the largest chunk of the RouDi config: unsupported, with the limit named.
        measure latency 1048577 0 1
        if [ "$status" = 4 ] && grep -q 1048576 "$work/measure.err"; then pass "1048577 B: exit 4: $(cat "$work/measure.err")"
        else fail "1048577 B: exit $status (expected 4 naming the limit): $(tr '\n' ' ' <"$work/measure.err")"; fi
        # One RouDi per machine: a second serve refuses while this one's RouDi runs.
        second="$work/second"; mkdir "$second"
        timeout 30 "$bin/$binary" serve --system "$system" --address "$second" </dev/null >"$work/second.out" 2>"$work/second.err"
        status=$?
        if [ "$status" = 3 ] && grep -q 'already running' "$work/second.err" && [ -z "$(ls -A "$second")" ] && kill -0 "$daemon_pid" 2>/dev/null; then
            pass "second serve: exit 3: $(cat "$work/second.err")"
        else
            fail "second serve: exit $status (expected 3, the first RouDi untouched): $(tr '\n' ' ' <"$work/second.err")"
        fi
    fi

    # Bad arguments: usage and exit 2.
    "$bin/$binary" measure --system "$system" --address "$address" --mode sideways >/dev/null 2>"$work/measure.err"
    status=$?
    if [ "$status" = 2 ] && grep -q usage "$work/measure.err"; then pass "bad arguments: exit 2 with usage"
    else fail "bad arguments: exit $status"; fi

    # Stop by closing stdin.
    exec {server_stdin}>&-
    if wait_exit "$server_pid" 10 && [ "$exit_status" = 0 ]; then pass "serve exits 0 at end of stdin"
    else fail "serve did not exit 0 within 10 s of end of stdin"; kill -9 "$server_pid" 2>/dev/null; fi
    check_cleaned_up "in the address directory" ""

    # serve --corrupt: a wrong echo must make measure exit 3. Stop this one by SIGTERM.
    rm -rf "$address"; mkdir "$address"
    if start_server "$binary" "$system" "$address" "$work" --corrupt; then
        read_daemon_pid
        for payload in 64 0; do
            measure latency "$payload" 0 10
            if [ "$status" = 3 ] && [ "$(wc -l <"$work/measure.err")" = 1 ] && [ ! -s "$work/measure.out" ]; then
                pass "serve --corrupt, $payload B: exit 3: $(cat "$work/measure.err")"
            else
                fail "serve --corrupt, $payload B: exit $status (expected 3 and one stderr line): $(tr '\n' ' ' <"$work/measure.err")"
            fi
        done
        kill -TERM "$server_pid"
        if wait_exit "$server_pid" 10 && [ "$exit_status" = 0 ]; then pass "serve exits 0 on SIGTERM"
        else fail "serve did not exit 0 within 10 s of SIGTERM"; kill -9 "$server_pid" 2>/dev/null; fi
        exec {server_stdin}>&-
        check_cleaned_up "after SIGTERM" " after SIGTERM"
    else
        fail "serve --corrupt: $start_error"; kill "$server_pid" 2>/dev/null; exec {server_stdin}>&-
    fi
    check_nothing_left_on_machine "$machine_before"
    rm -rf "$work" "$machine_before"
done

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
