// Seam: the monotonic clock (`clock_gettime(CLOCK_MONOTONIC)`, served by the vDSO on Linux and
// by commpage on Darwin). The one place the engine reads the time.
#if canImport(Glibc)
import CIPCShims
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `CLOCK_MONOTONIC` in nanoseconds: what the harness times with and deadlines are set in.
/// One `clock_gettime` call (served by the vDSO, no system call), no allocation.
@inline(__always)
package func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
}
