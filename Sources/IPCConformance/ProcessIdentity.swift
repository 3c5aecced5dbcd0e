// Seam: this process's user and group ids (getuid, getgid), the same calls on Linux and Darwin.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The real user id of this process, which the suite's peer processes share.
func currentUserID() -> UInt32 { UInt32(getuid()) }

/// The real group id of this process.
func currentGroupID() -> UInt32 { UInt32(getgid()) }
