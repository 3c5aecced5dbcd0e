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
///
/// Where `pidfd_open` is missing or refused (`ENOSYS`: a kernel before 5.3, or valgrind;
/// `EPERM`/`EACCES`: a seccomp filter, as in container runtimes with an older default profile),
/// or with `IPCBENCH_PROCESS_WATCH=poll`, the watcher polls instead: one thread of its own, made
/// at the first such watch, reads `/proc/<pid>/stat` of every watched process every
/// ``pollInterval`` (10 ms, or `IPCBENCH_PROCESS_WATCH_INTERVAL_MS`) and reports an exit when
/// the file is gone, says the process is a zombie with no thread left (``ProcessStat/exited``:
/// a main thread that ended before the others is not an exit, as for a pidfd), or names another
/// start time (a later process given the same pid). An exit is then seen up to
/// that much later; the handler still runs on the loop's thread. The thread ends when nothing is
/// watched; a stat file it cannot open for want of a descriptor is looked at again next round,
/// never taken for an exit.
package final class ProcessWatcher: Sendable {
    package static let shared = ProcessWatcher(polling: ProcessWatcher.pollingRequested)

    /// How often the polling watcher looks at each watched process: 10 ms, or
    /// `IPCBENCH_PROCESS_WATCH_INTERVAL_MS` (whole milliseconds, 1 to 86,400,000; read once).
    package static let pollInterval: Duration = .milliseconds(
        getenv("IPCBENCH_PROCESS_WATCH_INTERVAL_MS").flatMap { Int(String(cString: $0)) }.flatMap { (1...86_400_000).contains($0) ? $0 : nil } ?? 10
    )

    /// Whether `IPCBENCH_PROCESS_WATCH=poll` asks for the polling watcher (read once).
    private static let pollingRequested = getenv("IPCBENCH_PROCESS_WATCH").map { String(cString: $0) } == "poll"

    /// A registration; cancelling it guarantees the handler will not start afterwards.
    package struct Watch: Sendable, Hashable {
        fileprivate let token: UInt64
        fileprivate let polled: Bool
    }

    private struct Entry {
        var pidfd: CInt
        var loop: EventLoop
        var handler: @Sendable () -> Void
    }

    /// A process watched by polling: who it is, and whether its exit is on the way to its loop.
    private struct PolledEntry {
        var pid: Int32
        var startTime: UInt64
        var loop: EventLoop
        var handler: @Sendable () -> Void
        var reported = false
    }

    private struct Polling {
        var entries: [UInt64: PolledEntry] = [:]
        var nextToken: UInt64 = 1
        var threadStarted = false
    }

    private let entries = Mutex<[UInt64: Entry]>([:])
    private let polling = Mutex(Polling())
    /// Whether every watch polls (`IPCBENCH_PROCESS_WATCH=poll`, or a watcher made so).
    private let alwaysPolls: Bool
    /// Set once `pidfd_open` was missing or refused: later watches poll without asking again.
    private let pidfdUnavailable = Atomic<Bool>(false)

    /// - Parameter polling: watch every process by polling `/proc` (tests, and
    ///   `IPCBENCH_PROCESS_WATCH=poll`), not through pidfds.
    package init(polling: Bool) {
        alwaysPolls = polling
    }

    /// Whether this watcher polls (by request, or since `pidfd_open` was missing or refused).
    package var polls: Bool { alwaysPolls || pidfdUnavailable.load(ordering: .relaxed) }

    /// Calls `handler` once, on the event loop's thread, when process `pid` exits. If it has
    /// already exited (or never existed), the handler runs at once on the calling thread.
    /// - Throws: ``IPCError/Code/transportFailure`` if a pidfd cannot be opened (for another
    ///   reason than its call being missing or refused) or watched, or the polling thread cannot
    ///   be started.
    @discardableResult
    package func watch(pid: Int32, _ handler: @escaping @Sendable () -> Void) throws -> Watch {
        let loop = try EventLoop.shared()
        if polls { return try watchPolling(pid: pid, loop: loop, handler) }
        let pidfd = ipc_pidfd_open(pid, 0)
        if pidfd < 0 {
            let error = Errno(rawValue: errno)
            if error == .noSuchProcess {
                handler()
                return Watch(token: 0, polled: false)
            }
            if Self.meansUnavailable(error) {
                pidfdUnavailable.store(true, ordering: .relaxed)
                return try watchPolling(pid: pid, loop: loop, handler)
            }
            throw IPCError.syscall("pidfd_open", error, context: "pid \(pid)")
        }
        _ = fcntl(pidfd, F_SETFD, FD_CLOEXEC)
        let exit = ExitHandler(watcher: self)
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
        return Watch(token: token, polled: false)
    }

    /// Whether a failed `pidfd_open` means the call itself is missing or refused here, not that
    /// this process cannot be watched.
    private static func meansUnavailable(_ error: Errno) -> Bool {
        error == .noFunction || error == .notPermitted || error == .permissionDenied
    }

    private func watchPolling(pid: Int32, loop: EventLoop, _ handler: @escaping @Sendable () -> Void) throws -> Watch {
        let stat: ProcessStat
        switch ProcessStat.read(pid: pid) {
        case .found(let found) where !found.exited:
            stat = found
        case .found, .gone:
            handler()
            return Watch(token: 0, polled: true)
        case .unknown:
            throw IPCError(code: .transportFailure, message: "cannot watch process \(pid): its /proc/\(pid)/stat cannot be read (is the descriptor table full?)")
        }
        let (token, start): (UInt64, Bool) = polling.withLock { polling in
            let token = polling.nextToken
            polling.nextToken += 1
            polling.entries[token] = PolledEntry(pid: pid, startTime: stat.startTime, loop: loop, handler: handler)
            defer { polling.threadStarted = true }
            return (token, !polling.threadStarted)
        }
        if start {
            do {
                try PosixThread.detach(name: "ipc-pid-poll") { [self] in pollWhileWatched() }
            } catch {
                polling.withLock {
                    $0.entries[token] = nil
                    $0.threadStarted = false
                }
                throw error
            }
        }
        return Watch(token: token, polled: true)
    }

    /// The polling thread: every ``pollInterval``, each watched process's stat; an exit goes to
    /// the watch's loop, which ends the watch and calls its handler. It ends when nothing is
    /// watched any more (the next watch starts another), so a process whose watches have all
    /// ended has no thread waking for them.
    private func pollWhileWatched() {
        let nanoseconds = Int(Self.pollInterval.wholeNanoseconds)
        let interval = timespec(tv_sec: nanoseconds / 1_000_000_000, tv_nsec: nanoseconds % 1_000_000_000)
        while true {
            var request = interval
            var rest = timespec()
            while nanosleep(&request, &rest) != 0, errno == EINTR { request = rest }
            let watched: [(UInt64, Int32, UInt64)]? = polling.withLock { polling in
                guard !polling.entries.isEmpty else {
                    polling.threadStarted = false
                    return nil
                }
                return polling.entries.compactMap { $0.value.reported ? nil : ($0.key, $0.value.pid, $0.value.startTime) }
            }
            guard let watched else { return }
            for (token, pid, startTime) in watched {
                switch ProcessStat.read(pid: pid) {
                case .found(let stat) where !stat.exited && stat.startTime == startTime: continue
                // Says nothing of the process (no descriptor to spare): the next round looks again.
                case .unknown: continue
                case .found, .gone: break
                }
                let loop: EventLoop? = polling.withLock { polling in
                    guard polling.entries[token]?.reported == false else { return nil }
                    polling.entries[token]?.reported = true
                    return polling.entries[token]?.loop
                }
                loop?.execute { [self] in polledExited(token) }
            }
        }
    }

    /// Stops watching. After it returns, the handler does not start (it may be running already).
    package func cancel(_ watch: Watch) {
        if watch.polled {
            _ = polling.withLock { $0.entries.removeValue(forKey: watch.token) }
            return
        }
        guard let entry = entries.withLock({ $0.removeValue(forKey: watch.token) }) else { return }
        entry.loop.deregister(watch.token)
        try? FileDescriptor(rawValue: entry.pidfd).close()
    }

    /// Whether `pid` is alive right now (a zombie counts as dead). Where `pidfd_open` is missing
    /// or refused, or fails for want of a descriptor, `/proc/<pid>/stat` answers instead, and
    /// where that cannot be read either, `kill(pid, 0)`: only a process that is not there counts
    /// as dead, not a call that failed.
    package static func isAlive(pid: Int32) -> Bool {
        guard !shared.polls else { return aliveWithoutPidfd(pid) }
        let pidfd = ipc_pidfd_open(pid, 0)
        guard pidfd >= 0 else {
            let error = Errno(rawValue: errno)
            return error == .noSuchProcess ? false : aliveWithoutPidfd(pid)
        }
        defer { try? FileDescriptor(rawValue: pidfd).close() }
        var descriptor = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&descriptor, 1, 0)
            if ready >= 0 { return ready == 0 }
            if errno != EINTR { return aliveWithoutPidfd(pid) }
        }
    }

    private static func aliveWithoutPidfd(_ pid: Int32) -> Bool {
        switch ProcessStat.read(pid: pid) {
        case .found(let stat): return !stat.exited
        case .gone: return false
        case .unknown: return kill(pid, 0) == 0 || errno != ESRCH
        }
    }

    fileprivate func exited(_ token: UInt64) {
        guard let entry = entries.withLock({ $0.removeValue(forKey: token) }) else { return }
        entry.loop.deregister(token)
        try? FileDescriptor(rawValue: entry.pidfd).close()
        entry.handler()
    }

    /// Loop thread: a polled process's exit, unless its watch was cancelled meanwhile.
    private func polledExited(_ token: UInt64) {
        guard let entry = polling.withLock({ $0.entries.removeValue(forKey: token) }) else { return }
        entry.handler()
    }

    /// Set once, right after registering; an event before that is reported again (the pidfd
    /// stays readable).
    private final class ExitHandler: EventHandler {
        let token = Atomic<UInt64>(0)
        /// Held while the pidfd is registered (the registration ends with the watch).
        let watcher: ProcessWatcher

        init(watcher: ProcessWatcher) {
            self.watcher = watcher
        }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            let token = token.load(ordering: .acquiring)
            if token != 0 { watcher.exited(token) }
        }
    }
}
#endif
