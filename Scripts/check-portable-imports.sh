#!/usr/bin/env bash
# Fails if a portable module imports a platform's C library (or this package's Linux layer)
# outside a platform conditional. The portable modules are the ones meant to build wherever
# Swift does (docs/DARWIN.md). Their platform code sits in seam files whose imports are inside
# `#if os(...)` or `#if canImport(...)` blocks (IPCEngine/Platform, IPCEngine/Linux,
# IPCConformance/RawByteStream.swift); an import under any other `#if` (say `#if true`) fails.
#
# Usage: check-portable-imports.sh [root]   (root defaults to the package; the self-test in
# Scripts/test.sh points it at a planted tree to show the check can fail)
set -euo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root"

portable=(IPCCore IPCFraming IPCSecureCoding IPCEngine IPCConformance)
platform='Glibc|Darwin|Musl|Android|WinSDK|CIPCShims|CNativeFloor|CMallocCounter|IPCSystem'

status=0
for module in "${portable[@]}"; do
    [ -d "Sources/$module" ] || continue
    while IFS= read -r file; do
        # A stack of open #if blocks, each 1 if its condition names a platform (os(...) or
        # canImport(...)); #elseif and #else stay in the block they continue.
        found=$(awk -v pattern="^[[:space:]]*(@_implementationOnly[[:space:]]+|@preconcurrency[[:space:]]+)?import[[:space:]]+(${platform})([[:space:]]|$)" '
            /^[[:space:]]*#if/ { depth++; platform[depth] = ($0 ~ /(os|canImport)\(/) ? 1 : 0; next }
            /^[[:space:]]*#elseif/ { if ($0 ~ /(os|canImport)\(/) platform[depth] = 1; next }
            /^[[:space:]]*#endif/ { depth--; next }
            $0 ~ pattern {
                guarded = 0
                for (level = 1; level <= depth; level++) if (platform[level]) guarded = 1
                if (!guarded) print FILENAME ":" NR ": " $0
            }
        ' "$file")
        if [ -n "$found" ]; then
            echo "$found"
            status=1
        fi
    done < <(find "Sources/$module" -name '*.swift')
done
if [ "$status" -ne 0 ]; then
    echo "platform imports outside an os()/canImport() conditional in a portable module (see docs/DARWIN.md)" >&2
else
    echo "portable modules (${portable[*]}): no platform imports outside a platform conditional"
fi
exit "$status"
