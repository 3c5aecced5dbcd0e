#!/usr/bin/env bash
# Installs the Debian packages ipcbench's tests and tools use, if any is missing.
#   curl      the stock HTTP client of the HTTP-framing interoperability test
#   chromium  headless browser that renders the HTML report in its test
#   libbenchmark-dev, g++, make  Google Benchmark, and what builds the native floor's
#             cross-check with it (Benchmarks/FloorCrossCheck)
#   systemd   /usr/bin/systemd-socket-activate, the launcher of the socket-activation tests
#             (systemd need not run)
#   valgrind  callgrind, which counts the instructions per round trip (Scripts/instructions.sh)
#   python3   /usr/bin/python3, which runs the tests' stand-in programs (a reference system's
#             serve and measure; a process whose main thread ends first)
set -euo pipefail

#
#   Scripts/install-system-packages.sh [PACKAGE...]   with arguments, those packages instead
#   (Benchmarks/References/install-system-packages.sh passes the reference systems' own)
packages=(curl chromium libbenchmark-dev g++ make systemd valgrind python3)
[ $# -gt 0 ] && packages=("$@")

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing Debian packages: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
