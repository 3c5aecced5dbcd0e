#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: system packages, build, tests.
# Extra arguments go to `swift test` (for example --filter UnixSocket).
set -euo pipefail
cd "$(dirname "$0")/.."

Scripts/install-system-packages.sh
# The modules meant to build wherever Swift does import no platform library outside an #if.
Scripts/check-portable-imports.sh
swift build --build-tests
swift test --skip-build "$@"
