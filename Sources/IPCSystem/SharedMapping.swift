import CIPCShims
import Glibc
import IPCCore
import SystemPackage

/// A file mapped `MAP_SHARED` into memory: what the store-based transports share between
/// processes. The file is created owner-only; the mapping stays valid after the file is unlinked.
public final class SharedMapping: @unchecked Sendable {
    // @unchecked: immutable; the memory it maps is shared with other processes, reached through atomics.
    public let path: String
    public let base: UnsafeMutableRawPointer
    public let length: Int

    /// Maps `path`, creating it with `length` zero bytes if it does not exist (and `create` is set).
    /// - Throws: ``IPCError/Code/endpointNotFound`` if it does not exist and `create` is false;
    ///   ``IPCError/Code/transportFailure`` otherwise.
    public init(path: String, length: Int, create: Bool, exclusive: Bool = false) throws {
        var flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW
        if create { flags |= O_CREAT }
        if exclusive { flags |= O_EXCL }
        let fd: CInt
        do {
            fd = try syscallRetryingInterrupts { open(path, flags, 0o600) }
        } catch {
            if error == .noSuchFileOrDirectory {
                throw IPCError(code: .endpointNotFound, message: "no store at \(path)", cause: error)
            }
            if error == .fileExists {
                throw IPCError(code: .endpointInUse, message: "\(path) exists", cause: error)
            }
            throw IPCError.syscall("open", error, context: path)
        }
        defer { try? FileDescriptor(rawValue: fd).close() }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw IPCError.syscall("fstat", Errno(rawValue: errno), context: path) }
        if status.st_size < length {
            guard create else {
                throw IPCError(code: .malformedFrame, message: "\(path) is \(status.st_size) bytes, shorter than the \(length) expected")
            }
            guard ftruncate(fd, off_t(length)) == 0 else { throw IPCError.syscall("ftruncate", Errno(rawValue: errno), context: path) }
        }
        guard let address = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), address != MAP_FAILED else {
            throw IPCError.syscall("mmap", Errno(rawValue: errno), context: path)
        }
        self.path = path
        self.base = address
        self.length = length
    }

    deinit {
        munmap(base, length)
    }

    /// A 32-bit word at `offset`, for atomics and futexes.
    public func word32(at offset: Int) -> UnsafeMutablePointer<UInt32> {
        (base + offset).assumingMemoryBound(to: UInt32.self)
    }

    /// A 64-bit word at `offset`.
    public func word64(at offset: Int) -> UnsafeMutablePointer<UInt64> {
        (base + offset).assumingMemoryBound(to: UInt64.self)
    }
}

/// A 32-bit sequence number in shared memory that processes wait on and bump: the futex-based
/// counterpart of a notify(3) name. Posting increments it and wakes every waiter; a waiter that
/// compares the value with the one it last saw can never miss a post, only see several at once.
///
/// The word holds a 31-bit count (wrapping) and, in bit 31, a waiters flag that a waiter sets
/// before it sleeps and the next post clears: a post makes the `FUTEX_WAKE` system call only when
/// the flag was set, so posting with nobody waiting is one atomic read-modify-write.
public struct FutexCounter: @unchecked Sendable {
    // @unchecked: the word is only touched through atomic and futex calls.
    public let address: UnsafeMutablePointer<UInt32>
    /// The mapping that holds the word, kept alive as long as the counter is.
    private let mapping: SharedMapping?

    public init(in mapping: SharedMapping, at offset: Int) {
        self.address = mapping.word32(at: offset)
        self.mapping = mapping
    }

    /// A counter in memory of this process's own, which the caller keeps allocated.
    public init(address: UnsafeMutablePointer<UInt32>) {
        self.address = address
        self.mapping = nil
    }

    /// The count (without the waiters flag).
    public var value: UInt32 { ipc_atomic_load_u32(address) & ~IPC_FUTEX_COUNTER_WAITERS }

    /// Increments the counter and wakes every process waiting on it (no system call when none is).
    public func post() {
        _ = ipc_futex_counter_post(address)
    }

    /// Wakes waiters without posting (they re-check their own conditions).
    public func wakeAll() {
        _ = ipc_futex_wake(address, Int32.max)
    }

    /// Sleeps until the counter differs from `seen`, at most `timeout` (`nil`: no limit; zero
    /// or less: not at all). Returns the value now held; it may still equal `seen` after a
    /// timeout or a wake without a post.
    @discardableResult
    public func wait(whileEqualTo seen: UInt32, timeout: Duration? = nil) -> UInt32 {
        ipc_futex_counter_wait(address, seen, Self.nanoseconds(timeout))
    }

    /// The shims' timeout: nanoseconds, -1 for none.
    private static func nanoseconds(_ timeout: Duration?) -> Int64 {
        timeout.map { Int64(clamping: $0.wholeNanoseconds) } ?? -1
    }

    /// The most counters ``wait(_:whileEqualTo:timeout:)`` takes.
    public static let maximumWaitedAtOnce = Int(IPC_FUTEX_COUNTERS_MAX)

    /// How ``wait(_:whileEqualTo:timeout:)`` ended.
    public enum WaitOutcome: Sendable {
        /// A count already differed from its seen value: nothing slept.
        case changed
        /// Slept until a wake, a change or the timeout: look again.
        case woke
        /// The kernel refused: it has no `futex_waitv` (before Linux 5.16), or failed the call.
        /// Nothing slept: the caller waits another way.
        case unavailable
    }

    /// ``wait(whileEqualTo:timeout:)`` for several counters at once, on one thread
    /// (`futex_waitv`): sleeps while every counter's count equals its `seen` value.
    /// - Precondition: at most ``maximumWaitedAtOnce`` counters, as many seen values.
    public static func wait(_ counters: [FutexCounter], whileEqualTo seen: [UInt32], timeout: Duration? = nil) -> WaitOutcome {
        precondition(counters.count == seen.count && counters.count <= maximumWaitedAtOnce)
        let addresses = counters.map { Optional($0.address) }
        let result = addresses.withUnsafeBufferPointer { addresses in
            seen.withUnsafeBufferPointer { seen in
                ipc_futex_counters_wait(addresses.baseAddress, seen.baseAddress, CInt(counters.count), nanoseconds(timeout))
            }
        }
        switch result {
        case 1: return .changed
        case 0: return .woke
        default: return .unavailable
        }
    }
}
