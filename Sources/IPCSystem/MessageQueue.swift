import CIPCShims
import Glibc
import IPCCore
public import SystemPackage

/// A POSIX message queue descriptor (`mq_open`): kernel-queued, named, message-preserving.
/// Descriptors are close-on-exec; queues are created owner-only.
public struct MessageQueue: Sendable {
    public let descriptor: FileDescriptor
    public let name: String

    /// When a call that waits for the queue (``send(_:priority:deadline:)``,
    /// ``receive(into:deadline:)``) gives up: a point in time, so that the fragments of one
    /// message share it. Made from a timeout with ``after(_:)``. (It is `CLOCK_REALTIME`, which
    /// `mq_timedsend` and `mq_timedreceive` require.)
    public struct Deadline: Sendable {
        fileprivate let time: timespec

        fileprivate init(time: timespec) {
            self.time = time
        }

        /// `timeout` from now; a timeout of zero or less has passed already, so a call returns
        /// at once instead of waiting. A timeout beyond what a `timespec` holds waits for good.
        public static func after(_ timeout: Duration) -> Deadline {
            guard timeout > .zero else { return .passed }
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            let (seconds, attoseconds) = timeout.components
            var nanoseconds = Int(now.tv_nsec) + Int(attoseconds / 1_000_000_000)
            var carry = 0
            if nanoseconds >= 1_000_000_000 {
                nanoseconds -= 1_000_000_000
                carry = 1
            }
            let (sum, overflow) = Int(now.tv_sec).addingReportingOverflow(Int(clamping: seconds) &+ carry)
            if overflow || sum < 0 { return Deadline(time: timespec(tv_sec: .max, tv_nsec: 999_999_999)) }
            return Deadline(time: timespec(tv_sec: sum, tv_nsec: nanoseconds))
        }

        /// Long past: a call that would wait returns at once.
        fileprivate static var passed: Deadline { Deadline(time: timespec(tv_sec: 0, tv_nsec: 0)) }
    }

    /// The kernel's limits for queues an unprivileged process creates
    /// (`/proc/sys/fs/mqueue/msg_max` and `msgsize_max`; 10 and 8192 by default).
    public static let systemLimits: (maximumMessages: Int, messageSize: Int) = (
        readLimit("/proc/sys/fs/mqueue/msg_max") ?? 10,
        readLimit("/proc/sys/fs/mqueue/msgsize_max") ?? 8192
    )

    private static func readLimit(_ path: String) -> Int? {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { try? FileDescriptor(rawValue: fd).close() }
        var bytes = [UInt8](repeating: 0, count: 32)
        let count = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return Int(String(decoding: bytes.prefix(count).prefix { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }, as: UTF8.self))
    }

    /// Creates a new queue for reading; fails if one of that name exists.
    /// - Throws: ``IPCError/Code/endpointInUse`` if the name exists; ``IPCError/Code/transportFailure``
    ///   otherwise, naming `RLIMIT_MSGQUEUE` when the per-user queue memory is exhausted.
    ///
    /// Queues outlive their processes: a server killed before it removed its queue leaves it,
    /// and its memory stays counted against its user's `RLIMIT_MSGQUEUE` (800 KiB by default,
    /// about nine of the package's queues). So when the quota is used up, the package's queues
    /// (named `/ipcb.…`) of this user that no process holds open are removed
    /// (``removeAbandoned(prefix:)``), and the queue is created again, once.
    public static func create(name: String, maximumMessages: Int, messageSize: Int) throws -> MessageQueue {
        var swept: [String]?
        while true {
            let fd = ipc_mq_open(name, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600, maximumMessages, messageSize)
            if fd >= 0 { return MessageQueue(descriptor: FileDescriptor(rawValue: fd), name: name) }
            let error = Errno(rawValue: errno)
            switch error {
            case .fileExists:
                throw IPCError(code: .endpointInUse, message: "message queue \(name) exists", cause: error)
            case .tooManyOpenFiles, .noMemory, .noSpace:
                if swept == nil {
                    let removed = removeAbandoned()
                    swept = removed
                    if !removed.isEmpty { continue }
                }
                throw IPCError(
                    code: .transportFailure,
                    message: "cannot create message queue \(name): this user's queue memory (RLIMIT_MSGQUEUE, `ulimit -q`) or the machine's queue count (/proc/sys/fs/mqueue/queues_max) is used up by queues that live processes hold open (\(swept?.count ?? 0) abandoned ones were removed); `ls -l /dev/mqueue` lists them",
                    cause: error
                )
            default:
                throw IPCError.syscall("mq_open", error, context: name)
            }
        }
    }

    /// Removes this user's message queues named `/<prefix>…` that no process holds open: those
    /// that processes which died (or forgot them) left behind. Lists names through the queue
    /// file system at `/dev/mqueue` (nothing is removed if it is not mounted) and open queues
    /// through `/proc/<pid>/fd` (a queue descriptor reads as `/<name>` there), so a queue a live
    /// process of this user holds is never removed. Returns the names removed.
    @discardableResult
    public static func removeAbandoned(prefix: String = "ipcb.") -> [String] {
        removeAbandoned { $0.hasPrefix(prefix) }
    }

    /// ``removeAbandoned(prefix:)`` for the names (without the leading `/`) that `matching` picks.
    @discardableResult
    public static func removeAbandoned(matching: (String) -> Bool) -> [String] {
        abandoned(matching: matching).filter { mq_unlink($0) == 0 }
    }

    /// This user's queues (`/name`) that `matching` picks and no process holds open, as
    /// ``removeAbandoned(matching:)`` finds them, without removing any.
    public static func abandoned(matching: (String) -> Bool) -> [String] {
        let uid = geteuid()
        let candidates = directoryEntries("/dev/mqueue").filter { entry in
            guard matching(entry) else { return false }
            var status = stat()
            return lstat("/dev/mqueue/" + entry, &status) == 0 && status.st_uid == uid
        }
        guard !candidates.isEmpty else { return [] }
        var held = Set<String>()
        for process in directoryEntries("/proc") where process.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) {
            let fds = "/proc/\(process)/fd"
            for fd in directoryEntries(fds) {
                var target = [CChar](repeating: 0, count: 512)
                let count = readlink(fds + "/" + fd, &target, target.count - 1)
                guard count > 1, target[0] == CChar(UInt8(ascii: "/")) else { continue }
                held.insert(String(decoding: target[1..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self))
            }
        }
        return candidates.filter { !held.contains($0) }.map { "/" + $0 }
    }

    /// The names in directory `path`, without `.` and `..`; empty if it cannot be read.
    private static func directoryEntries(_ path: String) -> [String] {
        guard let directory = opendir(path) else { return [] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != ".", name != ".." { names.append(name) }
        }
        return names
    }

    /// Opens an existing queue.
    /// - Throws: ``IPCError/Code/endpointNotFound`` if there is none; ``IPCError/Code/accessDenied``.
    public static func open(name: String, forWriting: Bool) throws -> MessageQueue {
        let fd = ipc_mq_open(name, (forWriting ? O_WRONLY : O_RDONLY) | O_CLOEXEC, 0, 0, 0)
        guard fd >= 0 else {
            let error = Errno(rawValue: errno)
            switch error {
            case .noSuchFileOrDirectory:
                throw IPCError(code: .endpointNotFound, message: "no message queue \(name)", cause: error)
            case .permissionDenied:
                throw IPCError(code: .accessDenied, message: "not allowed to open message queue \(name)", cause: error)
            default:
                throw IPCError.syscall("mq_open", error, context: name)
            }
        }
        return MessageQueue(descriptor: FileDescriptor(rawValue: fd), name: name)
    }

    /// Removes the name; open descriptors keep working until closed.
    public static func unlink(name: String) {
        _ = mq_unlink(name)
    }

    /// Removes the name if it exists, and says why not if it cannot.
    /// - Throws: ``IPCError/Code/accessDenied`` if the queue belongs to another user (queue
    ///   names are one namespace for the whole machine, so another user can take a name first).
    public static func removeName(_ name: String) throws {
        guard mq_unlink(name) != 0 else { return }
        let error = Errno(rawValue: errno)
        switch error {
        case .noSuchFileOrDirectory:
            return
        case .permissionDenied, .notPermitted:
            throw IPCError(
                code: .accessDenied,
                message: "the message queue name \(name) is held by another user, who created it first (queue names are one namespace for the whole machine): use another endpoint name or group directory, or have that user or root remove it",
                cause: error
            )
        default:
            throw IPCError.syscall("mq_unlink", error, context: name)
        }
    }

    /// Whether a queue of that name exists.
    public static func exists(name: String) -> Bool {
        let fd = ipc_mq_open(name, O_RDONLY | O_CLOEXEC, 0, 0, 0)
        if fd >= 0 { try? FileDescriptor(rawValue: fd).close() }
        return fd >= 0 || errno != ENOENT
    }

    /// Whether the queue's name has been removed (`mq_unlink`): it has no link left in the queue
    /// file system (open descriptors keep it alive). `false` if that cannot be told.
    public var isUnlinked: Bool {
        var status = stat()
        return fstat(descriptor.rawValue, &status) == 0 && status.st_nlink == 0
    }

    /// The queue's inode in the queue file system: tells one queue from another of the same name.
    public var inode: UInt64? {
        var status = stat()
        return fstat(descriptor.rawValue, &status) == 0 ? UInt64(status.st_ino) : nil
    }

    /// The inode of the queue registered as `name` now, or `nil` if none is (or it cannot be opened).
    public static func inode(named name: String) -> UInt64? {
        let fd = ipc_mq_open(name, O_RDONLY | O_CLOEXEC, 0, 0, 0)
        guard fd >= 0 else { return nil }
        defer { try? FileDescriptor(rawValue: fd).close() }
        var status = stat()
        return fstat(fd, &status) == 0 ? UInt64(status.st_ino) : nil
    }

    /// The number of messages in the queue now, from `mq_getattr`.
    public func messageCount() throws -> Int {
        var attributes = mq_attr()
        guard mq_getattr(descriptor.rawValue, &attributes) == 0 else { throw IPCError.syscall("mq_getattr", Errno(rawValue: errno), context: name) }
        return attributes.mq_curmsgs
    }

    /// The queue's message size, from `mq_getattr`.
    public func messageSize() throws -> Int {
        var attributes = mq_attr()
        guard mq_getattr(descriptor.rawValue, &attributes) == 0 else { throw IPCError.syscall("mq_getattr", Errno(rawValue: errno), context: name) }
        return attributes.mq_msgsize
    }

    /// Queues one message, waiting while the queue is full until `deadline`.
    /// - Throws: ``IPCError/Code/sendTimeout`` if the queue stayed full.
    public func send(_ bytes: UnsafeRawBufferPointer, priority: UInt32 = 0, deadline: Deadline) throws {
        var deadline = deadline.time
        do {
            _ = try syscallRetryingInterrupts { ipc_sys_mq_timedsend(descriptor.rawValue, bytes.baseAddress!.assumingMemoryBound(to: CChar.self), UInt(bytes.count), priority, &deadline) }
        } catch {
            if error == .timedOut {
                throw IPCError(code: .sendTimeout, message: "message queue \(name) stayed full until the send timeout", cause: error)
            }
            throw IPCError.syscall("mq_timedsend", error, context: name)
        }
    }

    /// Queues one message if the queue has room now, without waiting: whether it did.
    /// - Throws: ``IPCError/Code/transportFailure`` for anything but a full queue.
    public func sendIfRoom(_ bytes: UnsafeRawBufferPointer, priority: UInt32 = 0) throws -> Bool {
        // A deadline in the past: the call returns at once when the queue is full.
        var past = Deadline.passed.time
        do {
            _ = try syscallRetryingInterrupts { ipc_sys_mq_timedsend(descriptor.rawValue, bytes.baseAddress!.assumingMemoryBound(to: CChar.self), UInt(bytes.count), priority, &past) }
            return true
        } catch {
            if error == .timedOut { return false }
            throw IPCError.syscall("mq_timedsend", error, context: name)
        }
    }

    /// Waits for one message and returns its length.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        do {
            return try syscallRetryingInterrupts { ipc_sys_mq_timedreceive(descriptor.rawValue, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), UInt(buffer.count), nil, nil) }
        } catch {
            throw IPCError.syscall("mq_receive", error, context: name)
        }
    }

    /// Waits until `deadline` for one message; `nil` on timeout.
    public func receive(into buffer: UnsafeMutableRawBufferPointer, deadline: Deadline) throws -> Int? {
        var deadline = deadline.time
        do {
            return try syscallRetryingInterrupts { ipc_sys_mq_timedreceive(descriptor.rawValue, buffer.baseAddress!.assumingMemoryBound(to: CChar.self), UInt(buffer.count), nil, &deadline) }
        } catch {
            if error == .timedOut { return nil }
            throw IPCError.syscall("mq_timedreceive", error, context: name)
        }
    }

    /// Takes one message if the queue holds one, without waiting: its length, or `nil`.
    public func receiveIfReady(into buffer: UnsafeMutableRawBufferPointer) throws -> Int? {
        // A deadline in the past: the call returns at once when the queue is empty.
        try receive(into: buffer, deadline: .passed)
    }

    /// Closes the descriptor (once; the queue itself stays until its name is removed).
    public func close() {
        try? descriptor.close()
    }
}
