import CIPCShims
import Glibc
import IPCCore
import Synchronization
import SystemPackage

/// Tells when a process exits, through a pidfd (`pidfd_open`), on one background thread for the
/// whole process.
///
/// Transports without a connection to break (message queues, shared stores) learn of a peer's
/// death this way; it sees the death itself, not the closing of a descriptor that a child
/// process might still hold.
public final class ProcessWatcher: @unchecked Sendable {
    public static let shared = ProcessWatcher()

    /// A registration; cancelling it guarantees the handler will not start afterwards.
    public struct Watch: Sendable, Hashable {
        fileprivate let token: UInt64
    }

    private struct Entry {
        var pidfd: CInt
        var handler: @Sendable () -> Void
    }

    private let epollFD: CInt
    private let entries = Mutex<(next: UInt64, byToken: [UInt64: Entry])>((1, [:]))
    private let started = Mutex(false)

    private init() {
        epollFD = epoll_create1(CInt(EPOLL_CLOEXEC))
    }

    /// Calls `handler` once, on the watcher's thread, when process `pid` exits. If it has already
    /// exited (or never existed), the handler runs at once on the calling thread.
    /// - Throws: ``IPCError/Code/transportFailure`` if a pidfd cannot be opened or watched.
    @discardableResult
    public func watch(pid: Int32, _ handler: @escaping @Sendable () -> Void) throws -> Watch {
        let pidfd = ipc_pidfd_open(pid, 0)
        if pidfd < 0 {
            let error = Errno(rawValue: errno)
            if error == .noSuchProcess {
                handler()
                return Watch(token: 0)
            }
            throw IPCError.syscall("pidfd_open", error, context: "pid \(pid)")
        }
        _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
        try startThreadIfNeeded()
        let token = entries.withLock { state in
            let token = state.next
            state.next += 1
            state.byToken[token] = Entry(pidfd: pidfd, handler: handler)
            return token
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLONESHOT.rawValue
        event.data.u64 = token
        if epoll_ctl(epollFD, EPOLL_CTL_ADD, pidfd, &event) != 0 {
            let error = Errno(rawValue: errno)
            _ = entries.withLock { $0.byToken.removeValue(forKey: token) }
            closeDescriptor(pidfd)
            throw IPCError.syscall("epoll_ctl", error)
        }
        return Watch(token: token)
    }

    /// Stops watching. After it returns, the handler does not start (it may be running already).
    public func cancel(_ watch: Watch) {
        guard let entry = entries.withLock({ $0.byToken.removeValue(forKey: watch.token) }) else { return }
        _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, entry.pidfd, nil)
        closeDescriptor(entry.pidfd)
    }

    /// Whether `pid` is alive right now (a zombie counts as dead).
    public static func isAlive(pid: Int32) -> Bool {
        let pidfd = ipc_pidfd_open(pid, 0)
        guard pidfd >= 0 else { return false }
        defer { closeDescriptor(pidfd) }
        var descriptor = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, 0) == 0
    }

    private func startThreadIfNeeded() throws {
        try started.withLock { started in
            guard !started else { return }
            guard epollFD >= 0 else { throw IPCError(code: .transportFailure, message: "epoll_create1 failed") }
            try PosixThread.detach(name: "ipc-pidwatch") { [self] in run() }
            started = true
        }
    }

    private func run() {
        var events = [epoll_event](repeating: epoll_event(), count: 32)
        while true {
            let count = events.withUnsafeMutableBufferPointer { epoll_wait(epollFD, $0.baseAddress, CInt($0.count), -1) }
            if count < 0 { continue }
            for index in 0..<Int(count) {
                let token = events[index].data.u64
                guard let entry = entries.withLock({ $0.byToken.removeValue(forKey: token) }) else { continue }
                _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, entry.pidfd, nil)
                closeDescriptor(entry.pidfd)
                entry.handler()
            }
        }
    }
}
