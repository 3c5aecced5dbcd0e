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
printf '#if true\nimport IPCSystem\n#endif\n' > "$planted/Sources/IPCEngine/Planted.swift"
planted_output=$(Scripts/check-portable-imports.sh "$planted" 2>&1) && { echo "the import check passed a planted import" >&2; exit 1; }
[ "$(grep -c 'Planted.swift' <<< "$planted_output")" -eq 2 ] || { echo "the import check missed a planted import: $planted_output" >&2; exit 1; }
echo "the import check catches planted imports"
# No async body calls a blocking primitive: it would hold one of the few cooperative threads.
Scripts/check-blocking-calls.sh
# ...and the check can fail: usleep in an async func, mq_timedsend in an async closure; not
# Task.sleep in an async func nor usleep in a sync one.
mkdir -p "$planted/blocking/Sources/X"
printf 'import Glibc\nfunc pause() async {\n    usleep(1000)\n}\n' > "$planted/blocking/Sources/X/Planted.swift"
printf 'import Glibc\nlet send = { (queue: mqd_t) async in\n    var deadline = timespec()\n    _ = mq_timedsend(queue, nil, 0, 0, &deadline)\n}\n' > "$planted/blocking/Sources/X/PlantedClosure.swift"
printf 'import Glibc\nfunc nap() async throws {\n    try await Task.sleep(for: .milliseconds(1))\n}\nfunc napBlocking() {\n    usleep(1000)\n}\n' > "$planted/blocking/Sources/X/Clean.swift"
planted_output=$(Scripts/check-blocking-calls.sh "$planted/blocking" 2>&1) && { echo "the blocking-call check passed a planted blocking call" >&2; exit 1; }
{ [ "$(grep -c ' called in async ' <<< "$planted_output")" -eq 2 ] \
    && grep -q '^Sources/X/Planted.swift:3: usleep called in async func pause$' <<< "$planted_output" \
    && grep -q '^Sources/X/PlantedClosure.swift:4: mq_timedsend called in async closure' <<< "$planted_output"; } \
    || { echo "the blocking-call check did not flag exactly the planted calls: $planted_output" >&2; exit 1; }
echo "the blocking-call check catches planted blocking calls"
swift build --build-tests
swift test --skip-build "$@"
