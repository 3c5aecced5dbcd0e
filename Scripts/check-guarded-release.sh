#!/usr/bin/env bash
# The SIGBUS guards of shared files (SharedMapping's guarded accesses, ipc_guarded_* in CIPCShims)
# in a release build: the tests run the debug build, where the C shims are not optimised, and a
# release build's guard once caught nothing (the compiler removed the store that arms it). A
# release `ipcbench notifyutil` posts in a loop while another process cuts the group's
# notify.center to 0 bytes five times; it must still be running afterwards (it died with SIGBUS,
# exit 135), and the file must be back at its length.
#
#   Scripts/check-guarded-release.sh [BINARY]     (default .build/release/ipcbench)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-.build/release/ipcbench}
[ -x "$binary" ] || { echo "check-guarded-release.sh: no executable at $binary" >&2; exit 66; }
work=$(mktemp -d "${TMPDIR:-/tmp}/ipcbench-guarded-XXXXXX")
poster=
trap '[ -z "$poster" ] || kill "$poster" 2>/dev/null || true; rm -rf "$work"' EXIT
group="$work/g"
"$binary" notifyutil --group "$group" --set guarded.check=1
"$binary" notifyutil --group "$group" --post guarded.check --count 2000000000 > "$work/poster.log" 2>&1 &
poster=$!
sleep 1
for _ in 1 2 3 4 5; do
    truncate --size 0 "$group/notify.center"
    sleep 0.3
done
sleep 0.5
if ! kill -0 "$poster" 2>/dev/null; then
    status=0
    wait "$poster" || status=$?
    poster=
    echo "check-guarded-release.sh: the poster died (exit $status) when notify.center was cut under it:" >&2
    head -20 "$work/poster.log" >&2
    exit 1
fi
size=$(stat --format %s "$group/notify.center")
[ "$size" -eq 131136 ] || { echo "check-guarded-release.sh: notify.center is $size bytes after the cuts, not 131136" >&2; exit 1; }
echo "guarded accesses (release build): a poster outlived 5 cuts of notify.center, which is back at $size bytes"
