#if os(Linux)
import CIPCShims
import Glibc
import IPCCore
import IPCSystem
import Synchronization
import SystemPackage

/// Tells when a process exits, through a pidfd (`pidfd_open`) watched by the process's
/// ``EventLoop``: no thread of its own.
///
/// Transports without a connection to break (message queues, shared stores) learn of a peer's
/// death this way; it sees the death itself, not the closing of a descriptor that a child
/// process might still hold.
package final class ProcessWatcher: Sendable {
    package static let shared = ProcessWatcher()

    /// A registration; cancelling it guarantees the handler will not start afterwards.
    package struct Watch: Sendable, Hashable {
        fileprivate let token: UInt64
    }

    private struct Entry {
        var pidfd: CInt
        var loop: EventLoop
        var handler: @Sendable () -> Void
    }

    private let entries = Mutex<[UInt64: Entry]>([:])

    private init() {}

    /// Calls `handler` once, on the event loop's thread, when process `pid` exits. If it has
    /// already exited (or never existed), the handler runs at once on the calling thread.
    /// - Throws: ``IPCError/Code/transportFailure`` if a pidfd cannot be opened or watched.
    @discardableResult
    package func watch(pid: Int32, _ handler: @escaping @Sendable () -> Void) throws -> Watch {
        let loop = try EventLoop.shared()
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
        let exit = ExitHandler()
        let token: UInt64
        do {
            token = try loop.register(pidfd, interest: .readable, handler: exit)
        } catch {
            try? FileDescriptor(rawValue: pidfd).close()
            throw error
        }
        // The loop may report the exit before the entry is in: it finds no entry, and the
        // pidfd, still readable, is reported again on its next round.
        entries.withLock { $0[token] = Entry(pidfd: pidfd, loop: loop, handler: handler) }
        exit.token.store(token, ordering: .releasing)
        return Watch(token: token)
    }

    /// Stops watching. After it returns, the handler does not start (it may be running already).
    package func cancel(_ watch: Watch) {
        guard let entry = entries.withLock({ $0.removeValue(forKey: watch.token) }) else { return }
        entry.loop.deregister(watch.token)
        try? FileDescriptor(rawValue: entry.pidfd).close()
    }

    /// Whether `pid` is alive right now (a zombie counts as dead).
    package static func isAlive(pid: Int32) -> Bool {
        let pidfd = ipc_pidfd_open(pid, 0)
        guard pidfd >= 0 else { return false }
        defer { try? FileDescriptor(rawValue: pidfd).close() }
        var descriptor = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, 0) == 0
    }

    fileprivate func exited(_ token: UInt64) {
        guard let entry = entries.withLock({ $0.removeValue(forKey: token) }) else { return }
        entry.loop.deregister(token)
        try? FileDescriptor(rawValue: entry.pidfd).close()
        entry.handler()
    }

    /// Set once, right after registering; an event before that is reported again (the pidfd
    /// stays readable).
    private final class ExitHandler: EventHandler {
        let token = Atomic<UInt64>(0)

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            let token = token.load(ordering: .acquiring)
            if token != 0 { ProcessWatcher.shared.exited(token) }
        }
    }
}
#endif
