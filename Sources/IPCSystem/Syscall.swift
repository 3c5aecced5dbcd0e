import Glibc
public import IPCCore
public import SystemPackage

/// Runs a system call, retrying it while it fails with `EINTR`, and throws its `Errno`.
///
/// The one place that retries interrupted calls (swift-system's `valueOrErrno(retryOnInterrupt:)`
/// does the same for the calls it wraps). Never use it for `close`, which must not be retried:
/// close with `FileDescriptor.close()` (`try?` where the outcome does not matter: after `close`
/// the descriptor is gone even when it reports an error), which makes the call once.
@inline(__always)
public func syscallRetryingInterrupts<T: FixedWidthInteger>(_ body: () -> T) throws(Errno) -> T {
    while true {
        let result = body()
        if result != -1 { return result }
        let error = Errno(rawValue: errno)
        if error != .interrupted { throw error }
    }
}

extension IPCError {
    /// A transport failure caused by a failed system call.
    public static func syscall(_ name: String, _ error: Errno, context: String = "") -> IPCError {
        IPCError(code: .transportFailure, message: "\(name) failed" + (context.isEmpty ? "" : " (\(context))") + ": \(error)", cause: error)
    }
}
