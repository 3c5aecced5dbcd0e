import CIPCShims
import Glibc
import IPCCore
import SystemPackage

/// A file mapped `MAP_SHARED` into memory: what the store-based transports share between
/// processes. The file is created owner-only; the mapping stays valid after the file is unlinked.
///
/// Any process of the user can truncate the file under the mapping, and a plain access to a page
/// past its new end then kills this process with SIGBUS. The `guarded…` accessors catch that
/// fault, put the file's length back (``restoreLength()``: the lost pages come back as zeros) and
/// try once more; they return `nil` only if the length cannot be put back.
public final class SharedMapping: @unchecked Sendable {
    // @unchecked: immutable; the memory it maps is shared with other processes, reached through atomics.
    public let path: String
    public let base: UnsafeMutableRawPointer
    public let length: Int
    /// The mapped file, kept open so that its length can be put back (the path may name
    /// another file by then).
    private let descriptor: CInt
    /// The mapped file's device and inode numbers, for ``isStillAtPath()``.
    private let device: UInt64
    private let inode: UInt64

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
        var mapped = false
        defer { if !mapped { try? FileDescriptor(rawValue: fd).close() } }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw IPCError.syscall("fstat", Errno(rawValue: errno), context: path) }
        // What was opened, checked on the descriptor: the directory may have been swapped for
        // another user's between its own checks and this open, and a file of theirs, mapped here,
        // is theirs to cut (SIGBUS) or to write.
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw IPCError(code: .invalidEndpoint, message: "\(path) is not a regular file")
        }
        guard status.st_uid == geteuid() else {
            throw IPCError(code: .invalidEndpoint, message: "\(path) belongs to user \(status.st_uid), not to this process's user (\(geteuid()))")
        }
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
        self.descriptor = fd
        self.device = UInt64(status.st_dev)
        self.inode = UInt64(status.st_ino)
        mapped = true
    }

    /// Whether `path` still names the mapped file: `false` once another process removed it, or
    /// put another file in its place (a process that opens the path then maps that one).
    public func isStillAtPath() -> Bool {
        var status = stat()
        guard lstat(path, &status) == 0 else { return false }
        return UInt64(status.st_dev) == device && UInt64(status.st_ino) == inode
    }

    deinit {
        munmap(base, length)
        close(descriptor)
    }

    /// Puts the file's length back if another process cut it below the mapping's, so that every
    /// page of the mapping is backed again (the cut pages as zeros). Returns whether it is.
    @discardableResult
    public func restoreLength() -> Bool {
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { return false }
        if status.st_size >= length { return true }
        return ftruncate(descriptor, off_t(length)) == 0
    }

    /// Runs a guarded access (`nil`: its page was gone), and once more after ``restoreLength()``
    /// if it failed.
    @inline(__always)
    private func retrying<T>(_ access: () -> T?) -> T? {
        if let value = access() { return value }
        guard restoreLength() else { return nil }
        return access()
    }

    /// The 32-bit word at `offset`, loaded (acquire); `nil` if the file was cut and could not be
    /// restored.
    public func guardedLoad32(at offset: Int) -> UInt32? {
        retrying {
            var value: UInt32 = 0
            return ipc_guarded_load_u32(word32(at: offset), &value) == 0 ? value : nil
        }
    }

    /// Stores the 32-bit word at `offset` (release); `false` if the file was cut and could not be
    /// restored.
    @discardableResult
    public func guardedStore32(_ value: UInt32, at offset: Int) -> Bool {
        retrying { ipc_guarded_store_u32(word32(at: offset), value) == 0 ? true : nil } ?? false
    }

    /// The 64-bit word at `offset`, loaded (acquire), as ``guardedLoad32(at:)``.
    public func guardedLoad64(at offset: Int) -> UInt64? {
        retrying {
            var value: UInt64 = 0
            return ipc_guarded_load_u64(word64(at: offset), &value) == 0 ? value : nil
        }
    }

    /// Stores the 64-bit word at `offset` (release), as ``guardedStore32(_:at:)``.
    @discardableResult
    public func guardedStore64(_ value: UInt64, at offset: Int) -> Bool {
        retrying { ipc_guarded_store_u64(word64(at: offset), value) == 0 ? true : nil } ?? false
    }

    /// The `count` bytes at `offset`; `nil` if the file was cut and could not be restored.
    public func guardedBytes(at offset: Int, count: Int) -> [UInt8]? {
        retrying {
            var bytes = [UInt8](repeating: 0, count: count)
            let copied = bytes.withUnsafeMutableBytes { ipc_guarded_copy($0.baseAddress!, base + offset, count) == 0 }
            return copied ? bytes : nil
        }
    }

    /// Copies `bytes` to `offset`; `false` if the file was cut and could not be restored.
    @discardableResult
    public func guardedWrite(_ bytes: [UInt8], at offset: Int) -> Bool {
        retrying {
            bytes.withUnsafeBytes { ipc_guarded_copy(base + offset, $0.baseAddress!, bytes.count) == 0 } ? true : nil
        } ?? false
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
    /// The mapping that holds the word, kept alive as long as the counter is (`nil`: memory of
    /// the process's own).
    public let mapping: SharedMapping?

    /// Its offset in ``mapping`` (0 for a counter in the process's own memory).
    public let offset: Int

    /// A counter in a mapped file: every access is guarded against the file being cut under the
    /// mapping (``SharedMapping``).
    public init(in mapping: SharedMapping, at offset: Int) {
        self.address = mapping.word32(at: offset)
        self.mapping = mapping
        self.offset = offset
    }

    /// A counter in memory of this process's own, which the caller keeps allocated.
    public init(address: UnsafeMutablePointer<UInt32>) {
        self.address = address
        self.mapping = nil
        self.offset = 0
    }

    /// The count (without the waiters flag). A counter in a mapped file that was cut and could
    /// not be restored (``SharedMapping``) reads 0.
    public var value: UInt32 {
        guard let mapping else { return ipc_atomic_load_u32(address) & ~IPC_FUTEX_COUNTER_WAITERS }
        return (mapping.guardedLoad32(at: offset) ?? 0) & ~IPC_FUTEX_COUNTER_WAITERS
    }

    /// Increments the counter and wakes every process waiting on it (no system call when none
    /// is). Returns `false` only for a counter in a mapped file that was cut and could not be
    /// restored: nothing was posted.
    @discardableResult
    public func post() -> Bool {
        guard let mapping else {
            _ = ipc_futex_counter_post(address)
            return true
        }
        if ipc_guarded_futex_counter_post(address) == 0 { return true }
        return mapping.restoreLength() && ipc_guarded_futex_counter_post(address) == 0
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
        guard let mapping else { return ipc_futex_counter_wait(address, seen, Self.nanoseconds(timeout)) }
        var value: UInt32 = 0
        if ipc_guarded_futex_counter_wait(address, seen, Self.nanoseconds(timeout), &value) == 0 { return value }
        // The file was cut: restored, the counter reads 0 (a change from a `seen` other than 0).
        mapping.restoreLength()
        return self.value
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
                ipc_guarded_futex_counters_wait(addresses.baseAddress, seen.baseAddress, CInt(counters.count), nanoseconds(timeout))
            }
        }
        switch result {
        case 1: return .changed
        case 0: return .woke
        case -2:
            // A counter's file was cut: put each back and look again (the counters read 0).
            for counter in counters { counter.mapping?.restoreLength() }
            return .woke
        default: return .unavailable
        }
    }
}
