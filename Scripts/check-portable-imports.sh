#!/usr/bin/env bash
# Fails if a portable module imports a platform's C library (or this package's Linux layer)
# outside an `#if` block. The portable modules are the ones meant to build wherever Swift does
# (docs/DARWIN.md); IPCEngine and IPCConformance still depend on the Linux layer and join this
# list once they build without it.
set -euo pipefail
cd "$(dirname "$0")/.."

portable=(IPCCore IPCFraming IPCSecureCoding)
platform='Glibc|Darwin|Musl|Android|WinSDK|CIPCShims|CNativeFloor|CMallocCounter|IPCPosix'

status=0
for module in "${portable[@]}"; do
    while IFS= read -r file; do
        # Track #if nesting: an import inside any #if block is a seam, and allowed.
        found=$(awk -v pattern="^[[:space:]]*(@_implementationOnly[[:space:]]+)?import[[:space:]]+(${platform})([[:space:]]|$)" '
            /^[[:space:]]*#if/ { depth++ }
            /^[[:space:]]*#endif/ { depth-- }
            depth == 0 && $0 ~ pattern { print FILENAME ":" NR ": " $0 }
        ' "$file")
        if [ -n "$found" ]; then
            echo "$found"
            status=1
        fi
    done < <(find "Sources/$module" -name '*.swift')
done
if [ "$status" -ne 0 ]; then
    echo "platform imports outside an #if in a portable module (see docs/DARWIN.md)" >&2
else
    echo "portable modules (${portable[*]}): no platform imports outside #if"
fi
exit "$status"
