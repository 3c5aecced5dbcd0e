#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: system packages, build, tests.
# Extra arguments go to `swift test` (for example --filter UnixSocket).
set -euo pipefail
cd "$(dirname "$0")/.."

Scripts/install-system-packages.sh
# POSIX message queues outlive their processes; the tests that reclaim a dead run's queues list
# them in their file system, which a container may not have mounted.
if [ ! -d /dev/mqueue ] || ! mountpoint -q /dev/mqueue; then
    { mkdir -p /dev/mqueue && mount -t mqueue none /dev/mqueue; } 2>/dev/null || echo "note: /dev/mqueue is not mounted (needs root); the queue-reclaiming tests will fail" >&2
fi
# The modules meant to build wherever Swift does import no platform library outside an #if.
Scripts/check-portable-imports.sh
# ...and the check can fail: a planted unconditional import, and one under `#if true`.
planted=$(mktemp -d)
trap 'rm -rf "$planted"' EXIT
mkdir -p "$planted/Sources/IPCCore" "$planted/Sources/IPCEngine"
printf 'import Glibc\n' > "$planted/Sources/IPCCore/Planted.swift"
printf '#if true\nimport IPCPosix\n#endif\n' > "$planted/Sources/IPCEngine/Planted.swift"
planted_output=$(Scripts/check-portable-imports.sh "$planted" 2>&1) && { echo "the import check passed a planted import" >&2; exit 1; }
[ "$(grep -c 'Planted.swift' <<< "$planted_output")" -eq 2 ] || { echo "the import check missed a planted import: $planted_output" >&2; exit 1; }
echo "the import check catches planted imports"
swift build --build-tests
swift test --skip-build "$@"
