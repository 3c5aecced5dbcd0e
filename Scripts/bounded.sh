#!/usr/bin/env bash
# Runs one step of .ci/run with a time limit, so that a step that hangs fails in minutes with
# what was hanging, rather than running the whole CI into its own limit with nothing said.
#
#   Scripts/bounded.sh SECONDS COMMAND [ARGUMENT ...]
#
# Prints the step's start (UTC) and, at its end, how long it took. Past SECONDS: every process
# the step started that still runs, with each thread's state and the system call it is in
# (/proc/PID/task/TID/syscall; its first number is the call: 7 poll, 202 futex, 232 epoll_wait,
# 0 read, 45 recvfrom, 47 recvmsg, 426 io_uring_enter on x86_64), and, where gdb is installed,
# the threads' stacks; then the step's processes are sent SIGTERM, 10 s later SIGKILL, and the
# script exits with status 124. Otherwise it exits with the command's own status.
set -uo pipefail

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: Scripts/bounded.sh SECONDS COMMAND [ARGUMENT ...]" >&2
    exit 2
fi
limit=$1
shift

started=$(date +%s)
echo "[$(date -u +%H:%M:%S)] step: $* (limit ${limit} s)" >&2

# The step in a process group of its own (set -m gives a background job one), so that all it
# started can be signalled at once.
set -m
"$@" &
step=$!
set +m
sleep "$limit" &
sleeper=$!

finished=""
wait -n -p finished "$step" "$sleeper"
status=$?
if [ "$finished" = "$step" ]; then
    kill "$sleeper" 2>/dev/null
    wait "$sleeper" 2>/dev/null
    echo "[$(date -u +%H:%M:%S)] step ended with status $status after $(( $(date +%s) - started )) s: $*" >&2
    exit "$status"
fi

# Past the limit: what the step's processes are doing.
descendants() {
    local children
    children=$(ps -o pid= --ppid "$1" 2>/dev/null || true)
    for child in $children; do
        echo "$child"
        descendants "$child"
    done
}
{
    echo "step ran past its limit of ${limit} s: $*"
    echo "its processes (pid, parent, state, elapsed, command):"
    processes="$step $(descendants "$step")"
    for pid in $processes; do
        ps -o pid=,ppid=,stat=,etime=,args= -p "$pid" 2>/dev/null | cut -c1-300 | sed 's/^/  /'
    done
    examined=0
    for pid in $processes; do
        [ -d "/proc/$pid" ] || continue
        echo "process $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)):"
        for task in /proc/"$pid"/task/*; do
            echo "  thread ${task##*/} $(cat "$task/comm" 2>/dev/null) state $(awk '{print $3}' "$task/stat" 2>/dev/null) syscall $(cat "$task/syscall" 2>/dev/null | cut -d' ' -f1-4)"
        done | head -40
        # Stacks of the first few processes that are not shells (gdb takes seconds each).
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in bash|sh|sleep|timeout) continue ;; esac
        if command -v gdb > /dev/null && [ "$examined" -lt 6 ]; then
            examined=$((examined + 1))
            timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 16" 2>/dev/null \
                | grep -E '^(Thread|#)' | cut -c1-220 | head -150 | sed 's/^/    /'
        fi
    done
} >&2
kill -TERM -- -"$step" 2>/dev/null
for _ in $(seq 10); do
    kill -0 "$step" 2>/dev/null || break
    sleep 1
done
kill -KILL -- -"$step" 2>/dev/null
wait "$step" 2>/dev/null
echo "[$(date -u +%H:%M:%S)] step stopped after $(( $(date +%s) - started )) s: $*" >&2
exit 124
