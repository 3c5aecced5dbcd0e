#!/usr/bin/env bash
# Installs the Debian packages the reference systems (Benchmarks/References) use, if any is missing,
# through the repository's own installer (Scripts/install-system-packages.sh).
#   libzmq3-dev     libzmq, for ref-zmq (zmq-reqrep, zmq-pushpull)
#   libsystemd-dev  sd-bus, for ref-dbus (dbus-daemon, dbus-p2p)
#   dbus-daemon     the daemon that ref-dbus serve starts for its private bus (system dbus-daemon)
#   iceoryx         iox-roudi, the RouDi daemon that ref-iceoryx serve starts (Eclipse iceoryx 2.0)
#   libiceoryx-binding-c-dev  iceoryx's C binding, for ref-iceoryx (iceoryx, iceoryx-spin)
#   libgrpc++-dev   gRPC C++ (1.51 on Debian 12), for ref-grpc-cpp (grpc-cpp)
#   pkg-config, gcc, g++, make  what finds those libraries and builds the C and C++ references
#                   (C/Makefile; g++ for ref-grpc-cpp and ref-iceoryx's one C++ file)
# The Swift references (ref-nio, ref-grpc) need only the Swift toolchain and their packages.
set -euo pipefail
exec "$(dirname "$0")/../../Scripts/install-system-packages.sh" libzmq3-dev libsystemd-dev dbus-daemon iceoryx libiceoryx-binding-c-dev libgrpc++-dev pkg-config gcc g++ make
