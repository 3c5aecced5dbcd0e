#!/usr/bin/env bash
# Installs the Debian packages the reference systems (Benchmarks/References) use, if any is missing,
# through the repository's own installer (Scripts/install-system-packages.sh).
#   libzmq3-dev     libzmq, for ref-zmq (zmq-reqrep, zmq-pushpull)
#   libsystemd-dev  sd-bus, for ref-dbus (dbus-daemon, dbus-p2p)
#   dbus-daemon     the daemon that ref-dbus serve starts for its private bus (system dbus-daemon)
#   iceoryx         iox-roudi, the RouDi daemon that ref-iceoryx serve starts (Eclipse iceoryx 2.0)
#   libiceoryx-binding-c-dev  iceoryx's C binding, for ref-iceoryx (iceoryx, iceoryx-spin)
#   pkg-config, gcc, g++, make  what finds those libraries and builds the C references (C/Makefile;
#                   g++ for ref-iceoryx's one C++ file)
# The Swift references (ref-nio, ref-grpc) need only the Swift toolchain and their packages.
set -euo pipefail
exec "$(dirname "$0")/../../Scripts/install-system-packages.sh" libzmq3-dev libsystemd-dev dbus-daemon iceoryx libiceoryx-binding-c-dev pkg-config gcc g++ make
