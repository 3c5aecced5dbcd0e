#!/usr/bin/env bash
# Builds the reference systems into Benchmarks/References/.build/bin/:
#   ref-zmq   (C, libzmq)    zmq-reqrep, zmq-pushpull
#   ref-dbus  (C, sd-bus)    dbus-daemon, dbus-p2p
#   ref-iceoryx (C, iceoryx 2.0 C binding)  iceoryx, iceoryx-spin
#   ref-grpc-cpp (C++, gRPC C++)  grpc-cpp
#   ref-nio   (Swift, NIO)   nio
#   ref-grpc  (Swift, gRPC)  grpc
# A reference whose dependency is missing is skipped with one line saying which Debian package
# brings it (install-system-packages.sh installs them all); the exit status is non-zero only if
# something whose dependencies are present fails to build.
#
#   Benchmarks/References/build.sh [--skip-swift | --skip-swift-grpc]
#
# --skip-swift builds neither Swift reference; --skip-swift-grpc builds ref-nio only: ref-grpc's
# dependencies (gRPC Swift, swift-nio-http2, swift-nio-ssl and swift-crypto with a BoringSSL
# each) take most of the references' build (both Swift ones 853 s, ref-nio alone 189 s, on a
# 2-vCPU AMD EPYC VM), so CI (.ci/run) leaves it to Scripts/bench.sh, which builds everything.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/.build/bin"
skip_swift=0 skip_swift_grpc=0
for argument in "$@"; do
    case "$argument" in
        --skip-swift) skip_swift=1 ;;
        --skip-swift-grpc) skip_swift_grpc=1 ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument '$argument'" >&2; exit 2 ;;
    esac
done
mkdir -p "$bin"
failed=0

have_library() { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1"; }

build_c() { # program library debian-package [compiler compiler's-debian-package]
    local program="$1" library="$2" package="$3" compiler="${4:-${CC:-cc}}" compiler_package="${5:-gcc}" skip=""
    if ! command -v make >/dev/null 2>&1 || ! command -v "$compiler" >/dev/null 2>&1; then
        skip="no $compiler or make (Debian $compiler_package, make)"
    elif ! command -v pkg-config >/dev/null 2>&1; then
        skip="pkg-config not found (Debian pkg-config)"
    elif ! have_library "$library"; then
        skip="$library not found (Debian $package)"
    fi
    if [ -n "$skip" ]; then
        rm -f "$bin/$program" # a skipped reference leaves no binary of an earlier build behind
        echo "skipped $program: $skip"
        return
    fi
    local started=$(date +%s)
    if make -s -C "$here/C" OUT="$bin" "$program"; then # make: rebuilt only if its sources changed
        echo "built $program in $(( $(date +%s) - started )) s"
    else
        rm -f "$bin/$program"
        echo "FAILED to build $program" >&2
        failed=1
    fi
}

build_c ref-zmq libzmq libzmq3-dev
build_c ref-dbus libsystemd libsystemd-dev
build_c ref-grpc-cpp grpc++ libgrpc++-dev "${CXX:-g++}" g++

# iceoryx's C binding has no pkg-config file: its headers are in /usr/include/iceoryx/v<version>/
# (C/Makefile finds them) and ref_iceoryx_chunk.cpp needs a C++ compiler.
rm -f "$bin/ref-iceoryx"
if ! compgen -G "/usr/include/iceoryx/v*/iceoryx_binding_c/api.h" >/dev/null \
    || ! compgen -G "/usr/lib/*/libiceoryx_binding_c.so" >/dev/null; then
    echo "skipped ref-iceoryx: iceoryx's C binding not found (Debian libiceoryx-binding-c-dev)"
elif ! command -v make >/dev/null 2>&1 || ! command -v "${CC:-cc}" >/dev/null 2>&1 || ! command -v "${CXX:-c++}" >/dev/null 2>&1; then
    echo "skipped ref-iceoryx: no C and C++ compiler or make (Debian gcc, g++, make)"
elif make -s -C "$here/C" OUT="$bin" ref-iceoryx; then
    echo "built ref-iceoryx"
    command -v iox-roudi >/dev/null 2>&1 \
        || echo "note: iox-roudi not found (Debian iceoryx): ref-iceoryx serve cannot start its RouDi"
else
    echo "FAILED to build ref-iceoryx" >&2
    failed=1
fi
if [ -x "$bin/ref-dbus" ] && ! command -v dbus-daemon >/dev/null 2>&1; then
    echo "note: dbus-daemon not found (Debian dbus-daemon): ref-dbus's system dbus-daemon cannot serve; dbus-p2p can"
fi

if [ "$skip_swift" -eq 1 ]; then
    echo "skipped ref-nio, ref-grpc: --skip-swift"
elif ! command -v swift >/dev/null 2>&1; then
    rm -f "$bin/ref-nio" "$bin/ref-grpc"
    echo "skipped ref-nio, ref-grpc: swift not found"
else
    started=$(date +%s)
    programs=(ref-nio ref-grpc)
    build=(swift build -c release)
    if [ "$skip_swift_grpc" -eq 1 ]; then
        programs=(ref-nio)
        build+=(--product ref-nio)
        rm -f "$bin/ref-grpc" # not left from an earlier build: a run would measure it
        echo "skipped ref-grpc: --skip-swift-grpc"
    fi
    if (cd "$here/Swift" && "${build[@]}"); then
        release="$(cd "$here/Swift" && swift build -c release --show-bin-path)"
        for program in "${programs[@]}"; do
            ln -sfn "$(realpath --relative-to="$bin" "$release/$program")" "$bin/$program"
        done
        echo "built ${programs[*]} in $(( $(date +%s) - started )) s"
    else
        for program in "${programs[@]}"; do rm -f "$bin/$program"; done
        echo "FAILED to build ${programs[*]}" >&2
        failed=1
    fi
fi

echo "binaries in $bin:" $(cd "$bin" && ls)
[ "$skip_swift" -eq 1 ] && [ -e "$bin/ref-nio" ] && echo "(ref-nio and ref-grpc are from an earlier build)"
exit "$failed"
