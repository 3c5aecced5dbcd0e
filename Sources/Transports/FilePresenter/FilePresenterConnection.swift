import CIPCShims
import Dispatch
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization
import SystemPackage

/// One side of a file presenter conversation.
///
/// A client appends its records to the listener's inbox and reads its own journal on the
/// process's event loop: an inotify watch on the journal (``JournalWatch``) wakes the loop,
/// which reads what the listener appended; a read that finds the journal locked tries again
/// from a loop timer, so no thread is kept per connection and the loop never waits for a lock.
/// On the listener, the loop reads the inbox for every client the same way and hands each
/// client's frames to its connection. Sends append on the calling thread when the peer's journal
/// is free and has room; otherwise an `async` send or request suspends its task between tries,
/// a synchronous one waits on its own thread, and one made on the loop's thread (an on-loop
/// handler's reply) is kept, in order, and appended by a task.
///
/// The other side's end is seen on the rendezvous socket the connection was set up over, which
/// both keep open: its end of file comes as soon as the peer's process closes its descriptors
/// (a killed process does that before it has finished exiting). Before acting on it, this side
/// reads what the peer appended, so a goodbye or a message written just before is not lost. The
/// peer's process is watched too (a pidfd), for a peer whose socket outlives it in a forked child.
public final class FilePresenterConnection: FrameConnection, @unchecked Sendable {
    // @unchecked: mutable state is behind Mutexes; the role's reader is used under its slot's lock.
    public let peer: PeerCredentials?

    package let core: ConnectionCore
    /// Where this side's records go; released when the connection ends.
    private let outbound: Mutex<JournalAppender?>
    /// The id this side puts in its records: the client's own, or the listener's (serial 0).
    private let sender: SenderID
    private let role: Role
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    /// The rendezvous socket, kept open for the connection's life, and its watch on the loop.
    private let lifeline = Mutex<(fd: CInt, watch: EventLoop.ReadinessWatch?)?>(nil)
    private let loop: EventLoop
    private let replySendTimeout: Duration = .seconds(5)

    enum Role {
        /// The client: its own journal, read through a presenter, which it removes when it ends.
        case client(Inbound)
        /// The listener's view of one client: the listener reads for it (`drain` reads the
        /// inbox now) and forgets it on invalidation; the client's journal is removed here if
        /// the client died.
        case server(clientJournalPath: String, drain: @Sendable () -> Void, onInvalidated: @Sendable (FilePresenterConnection) -> Void)
    }

    /// What a client reads: its journal, and the watch that says when to read it.
    final class Inbound: Sendable {
        let path: String
        let reader = JournalReaderSlot()
        let watch = Mutex<JournalWatch?>(nil)
        /// The next try of a read that found the journal locked, and whether its timer is armed.
        let retry = Mutex<(backoff: JournalRetry, armed: Bool)>((JournalRetry(), false))

        init(path: String) {
            self.path = path
        }
    }

    /// Frames a send on the loop's thread could not append at once, with their deadlines, in
    /// order; one task appends them (`draining`).
    private let deferred = Mutex<(frames: [(JournalAppender.Prepared, UInt64)], draining: Bool)>(([], false))

    init(peer: PeerCredentials?, outbound: JournalAppender, sender: SenderID, role: Role, options: ConnectionOptions, loop: EventLoop) {
        self.peer = peer
        // Both sides' journals are read on the loop: handlers' tasks may start there.
        self.core = ConnectionCore(options: options, loop: loop, loopExecutor: loop)
        self.loop = loop
        self.outbound = Mutex(outbound)
        self.sender = sender
        self.role = role
        callbacks.lend = { [weak self] _, header, payload in self?.lend(header, payload) ?? .notOffered }
        if case .client(let inbound) = role {
            callbacks.retry = { [weak self] in
                inbound.retry.withLock { $0.armed = false }
                self?.readJournal()
            }
        }
    }

    /// Watches the peer's process; its death invalidates the connection.
    func watchPeer(pid: Int32) throws {
        let watch = try ProcessWatcher.shared.watch(pid: pid) { [weak self] in
            self?.invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) exited")))
        }
        peerWatch.withLock { $0 = watch }
    }

    /// Keeps the rendezvous socket `fd` (owned from now on) and watches it on the loop: its end
    /// of file, or anything read from it, ends the connection.
    func adopt(lifeline fd: CInt) {
        let adopted = lifeline.withLock { lifeline -> Bool in
            guard core.latch.isValid, lifeline == nil else { return false }
            lifeline = (fd, nil)
            return true
        }
        guard adopted else {
            closeDescriptor(fd)
            return
        }
        do {
            let watch = try loop.watchReadable(FileDescriptor(rawValue: fd)) { [weak self] in self?.lifelineReadable(fd) }
            let stored = lifeline.withLock { lifeline -> Bool in
                guard lifeline?.fd == fd else { return false }
                lifeline?.watch = watch
                return true
            }
            // Ended meanwhile: finish closed the socket without this watch, so cancel it here.
            if !stored { loop.cancel(watch) }
        } catch {
            invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
        }
    }

    /// The rendezvous socket is readable (loop thread): the peer closed it, or wrote to it, which
    /// no peer following docs/WIRE-FORMAT.md does.
    private func lifelineReadable(_ fd: CInt) {
        var bytes = (UInt64(0), UInt64(0))
        let count = withUnsafeMutableBytes(of: &bytes) { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { return }
        // Once is enough (the socket would stay readable): stop watching, keep it until the end.
        if let watch = lifeline.withLock({ lifeline -> EventLoop.ReadinessWatch? in
            defer { lifeline?.watch = nil }
            return lifeline?.watch
        }) {
            loop.cancel(watch)
        }
        let reason: InvalidationReason
        if count > 0 {
            reason = InvalidationReason(.protocolError, error: IPCError(code: .malformedFrame, message: "the peer wrote to the rendezvous socket after the handshake"))
        } else {
            let pid = peer?.pid ?? 0
            reason = InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) closed the rendezvous socket without a goodbye: it exited"))
        }
        // What the peer appended before it went is read first, off the loop (delivering may
        // wait for the application to make room): a goodbye ends the connection as peerClosed,
        // and messages before it are delivered.
        DispatchQueue.global().async { [self] in
            drain()
            invalidate(reason)
        }
    }

    /// Reads what the peer has appended so far, all of it: waits for the application to make
    /// room if it must (this runs on a thread of its own, before the connection ends).
    private func drain() {
        switch role {
        case .client: readJournal(waitingForRoom: true)
        case .server(_, let drain, _): drain()
        }
    }

    /// The client's journal, which it removes when it ends.
    var journalPath: String? {
        if case .client(let inbound) = role { return inbound.path }
        return nil
    }

    public func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        finish(reason)
    }

    private func appender() throws -> JournalAppender {
        guard let appender = outbound.withLock({ $0 }) else {
            throw IPCError(code: .invalidated, message: "the connection is invalid (\(core.latch.reason.map { "\($0)" } ?? "closed"))")
        }
        return appender
    }

    public func sendFrame(_ frame: Frame, timeout: Duration) throws {
        let (appender, record) = try prepare(frame)
        if loop.inEventLoop {
            return try sendFromLoop(appender, record, until: deadline(after: timeout))
        }
        try appendWaiting(appender, record, until: deadline(after: timeout)) { false }
    }

    /// A send on the loop's thread never waits: appended at once if nothing is kept before it and
    /// the journal is free and has room, else kept, in order, for a task that appends it; if
    /// that task cannot by the deadline, the connection ends (nobody waits to be told).
    private func sendFromLoop(_ appender: JournalAppender, _ record: JournalAppender.Prepared, until giveUp: UInt64) throws {
        if deferred.withLock({ $0.frames.isEmpty && !$0.draining }),
            try invalidatingOnCorruption({ try appender.tryAppend(record, unrung: readerUnreachable) }) == nil
        {
            return
        }
        let start: Bool = deferred.withLock { deferred in
            deferred.frames.append((record, giveUp))
            defer { deferred.draining = true }
            return !deferred.draining
        }
        guard start else { return }
        Task { [self] in
            while let (kept, keptDeadline) = deferred.withLock({ deferred -> (JournalAppender.Prepared, UInt64)? in
                guard !deferred.frames.isEmpty else {
                    deferred.draining = false
                    return nil
                }
                return deferred.frames.removeFirst()
            }) {
                do {
                    try await appendSuspending(appender, kept, until: keptDeadline)
                } catch {
                    deferred.withLock { $0 = ([], false) }
                    invalidate(InvalidationReason(.transportFailure, error: error as? IPCError ?? IPCError(code: .transportFailure, message: "\(error)")))
                    return
                }
            }
        }
    }

    /// Sends a one-way message without holding a thread while it waits: if the peer's journal
    /// is locked or full, the task sleeps between tries (``sendFrameSuspending(_:timeout:)``).
    /// What ``ConnectionOptions/requestHandler``'s tasks reply with: the suspending send.
    /// Strong: the request server lets go of it when the connection finishes.
    private lazy var taskResponder: @Sendable (Frame) async throws -> Void = { [self] frame in
        try await sendFrameSuspending(frame, timeout: replySendTimeout)
    }

    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        try await sendFrameSuspending(Frame(kind: .message, msgid: msgid, payload: payload), timeout: timeout)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try await core.request(payload, msgid: msgid, receiveTimeout: receiveTimeout) { try await sendFrameSuspending($0, timeout: sendTimeout) }
    }

    /// Appends at once if the journal's lock is free and it has room (the usual case);
    /// otherwise tries again after suspending the task for a little longer each time (yields,
    /// then 10 µs doubling to 1 ms, as a thread's wait would), so that no thread is held for a
    /// journal that is locked or full, however many sends wait. An append is whole or not at
    /// all, so cancelling the task ends the wait with `CancellationError`, the record unsent;
    /// the connection's end ends it with ``IPCError/Code/invalidated``.
    private func sendFrameSuspending(_ frame: Frame, timeout: Duration) async throws {
        try Task.checkCancellation()
        let (appender, record) = try prepare(frame)
        try await appendSuspending(appender, record, until: deadline(after: timeout))
    }

    /// The tries of ``sendFrameSuspending(_:timeout:)``, until `giveUp`.
    private func appendSuspending(_ appender: JournalAppender, _ record: JournalAppender.Prepared, until giveUp: UInt64) async throws {
        let timeout = Duration.nanoseconds(Int64(clamping: giveUp &- min(giveUp, monotonicNanoseconds())))
        var attempt = 0
        while true {
            guard let obstacle = try invalidatingOnCorruption({ try appender.tryAppend(record, unrung: readerUnreachable) }) else { return }
            try core.checkValid()
            guard monotonicNanoseconds() < giveUp else {
                throw IPCError(code: .sendTimeout, message: obstacle == .full
                    ? "the peer's journal stayed full for \(timeout): its reader is not reading"
                    : "the peer's journal stayed locked for \(timeout)")
            }
            if attempt < Self.yieldsBeforeSleeping {
                await Task.yield()
            } else {
                try await Task.sleep(for: .microseconds(min(1000, 10 << min(attempt - Self.yieldsBeforeSleeping, 7))))
            }
            attempt += 1
            try Task.checkCancellation()
        }
    }

    /// Tries a suspending send makes, yielding between them, before it sleeps between tries.
    private static let yieldsBeforeSleeping = 8

    /// Appends, waiting until `giveUp` for the lock and for room, unless `cancelled()` becomes
    /// true (`CancellationError`) or the connection ends (``IPCError/Code/invalidated``) first.
    private func appendWaiting(_ appender: JournalAppender, _ record: JournalAppender.Prepared, until giveUp: UInt64, cancelled: () -> Bool) throws {
        do {
            try invalidatingOnCorruption {
                try appender.append(record, timeout: remaining(until: giveUp), cancelled: { cancelled() || !core.latch.isValid }, unrung: readerUnreachable)
            }
        } catch is CancellationError {
            try core.checkValid()
            throw CancellationError()
        }
    }

    /// Checks that `frame` can be sent, and encodes its record.
    private func prepare(_ frame: Frame) throws -> (JournalAppender, JournalAppender.Prepared) {
        try core.checkValid()
        guard frame.payload.count <= core.options.maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above the maximum of \(core.options.maximumPayloadLength)")
        }
        let appender = try appender()
        return (appender, try appender.prepare(RecordHeader(kind: .frame, sender: sender), frame: frame))
    }

    /// A record was committed but its reader could not be woken for it: the connection ends,
    /// and the peer, seeing that end on the rendezvous socket, reads what was committed first.
    private func readerUnreachable(_ error: IPCError) {
        invalidate(InvalidationReason(.transportFailure, error: error))
    }

    /// Runs `body`, an append; if it finds the peer's journal forged, corrupted or truncated,
    /// nothing more can be appended to it: the connection is invalidated, and the error thrown.
    private func invalidatingOnCorruption<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as IPCError where error.code == .malformedFrame || error.code == .truncatedFrame {
            invalidate(InvalidationReason(.protocolError, error: error))
            throw error
        }
    }

    /// The server's side of a client: its records are read by the listener's thread.
    private var isServer: Bool {
        if case .server = role { return true }
        return false
    }

    /// Acts on one record from the peer. Called by the thread that reads for this connection.
    /// Returns whether that thread should read on: `false` once ``messages``' buffer is full on
    /// a client's reading on the loop, which then stops until the application takes a message
    /// (the rest of the records stay in the reader). It never waits for the application: tasks
    /// that take messages may prefer the loop (``preferredTaskExecutor``), which runs them
    /// between reads.
    /// - Parameter waitingForRoom: wait for room instead (the lifeline's drain, on a thread of its own).
    @discardableResult
    func receive(_ record: JournalRecord, waitingForRoom: Bool = false) -> Bool {
        guard core.latch.isValid else { return true }
        switch record {
        case .frame(_, let frame, let offered):
            let reply = cachedReplySender(timeout: replySendTimeout)
            // A one-way message offered in place and declined is not offered again; one the
            // reader did not offer (its sender was not this connection yet) is offered now.
            let dispatch = { (whenFull: ConnectionCore.WhenFull) in
                self.core.dispatch(frame, replyNow: reply, responder: { reply }, whenFull: whenFull, offered: offered, taskResponder: { self.taskResponder })
            }
            // A server connection's records are read by the listener's thread, which serves
            // every client: it cannot wait for one application, so a full buffer ends this one.
            if isServer {
                if dispatch(.keep) {
                    invalidate(InvalidationReason(.transportFailure, error: .receiveBufferFull))
                }
                return true
            }
            if waitingForRoom {
                _ = dispatch(.wait)
                return true
            }
            guard dispatch(.keep) else { return true }
            // Full: read on once the application has taken one (at once if it has already).
            core.whenMessagesHaveRoom { [weak self] in self?.resumeReading() }
            return false
        case .lent:
            break
        case .oversized(_, let error):
            invalidate(InvalidationReason(.protocolError, error: error))
        case .control(let header):
            switch header.kind {
            case .goodbye:
                invalidate(InvalidationReason(.peerClosed))
            case .hello, .welcome, .frame:
                // Version 1's handshake records: skipped.
                break
            }
        }
        return true
    }

    /// Offers a one-way message from the peer, in place, to the borrowing handler (on the thread
    /// that reads for this connection). A message it declines comes back through
    /// ``receive(_:waitingForRoom:)`` with a payload of its own.
    func lend(_ header: FrameHeader, _ payload: UnsafeRawBufferPointer) -> JournalLending {
        guard core.latch.isValid, core.lendsMessages else { return .notOffered }
        return core.lend(header, payload, replyNow: cachedReplySender(timeout: replySendTimeout)) ? .taken : .declined
    }

    /// The application made room after the loop stopped reading: reads again, on the loop.
    private func resumeReading() {
        guard case .client = role else { return }
        loop.execute { [weak self] in self?.readJournal() }
    }

    /// Both sides' frames are read on the event loop: a task that prefers it is resumed there,
    /// without a hand-over to another thread.
    public var preferredTaskExecutor: (any TaskExecutor)? { loop }

    /// The journal changed (the loop's thread, woken by the client's ``JournalWatch``), or the
    /// lifeline's drain (a thread of its own, `waitingForRoom`): reads what was appended. On the
    /// loop it never waits: a journal found locked is read again from a timer. Skipped while
    /// another thread reads (the lifeline's drain, which reads everything).
    /// - Parameter waitingForRoom: see ``receive(_:waitingForRoom:)``.
    func readJournal(waitingForRoom: Bool = false) {
        guard case .client(let inbound) = role else { return }
        // Stopped because the application's buffer is full, and woken by a new append: read
        // nothing until it has room (reading one record would add it over the limit).
        if !waitingForRoom, core.dispatchWouldWait {
            core.whenMessagesHaveRoom { [weak self] in self?.resumeReading() }
            return
        }
        do {
            let lend: JournalLender? = core.lendsMessages ? callbacks.lend : nil
            let read = try inbound.reader.read(
                isActive: { core.latch.isValid }, ifFree: !waitingForRoom, lockTimeout: waitingForRoom ? .seconds(1) : .zero, lend: lend
            ) {
                receive($0, waitingForRoom: waitingForRoom)
            }
            if !waitingForRoom { retryIfLocked(inbound, read: read) }
        } catch {
            let error = error as? IPCError
            invalidate(InvalidationReason(error?.code == .transportFailure ? .transportFailure : .protocolError, error: error))
        }
    }

    /// The lender and the retry timer's action, made once (``JournalReadCallbacks``).
    private let callbacks = JournalReadCallbacks()

    /// After a read on the loop: if it found the journal locked, reads again from a loop timer
    /// (one armed at a time), sooner the first times.
    private func retryIfLocked(_ inbound: Inbound, read: Bool) {
        let delay: UInt64? = inbound.retry.withLock { retry in
            guard !read else {
                retry.backoff.reset()
                return nil
            }
            guard !retry.armed, core.latch.isValid else { return nil }
            retry.armed = true
            return retry.backoff.next()
        }
        guard let delay else { return }
        guard let retry = callbacks.retry else { return }
        loop.schedule(at: monotonicNanoseconds() &+ delay, retry)
    }

    /// Releases everything, once, and reports the invalidation last.
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            if let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
            let reason = core.latch.reason ?? reason
            let outbound = outbound.withLock { $0.take() }
            if reason.kind != .peerClosed, reason.kind != .peerDied {
                // Whatever ended this side, unless the other side did, tell it (a client whose
                // connection the listener ended, for an unreadable inbox say, would otherwise
                // wait for replies that never come), without waiting long on a busy or full journal.
                try? outbound?.append(RecordHeader(kind: .goodbye, sender: sender), timeout: .milliseconds(100))
            }
            // After the goodbye, so that a peer woken by the end of file finds it.
            if let (fd, watch) = lifeline.withLock({ $0.take() }) {
                if let watch { loop.cancel(watch) }
                closeDescriptor(fd)
            }
            switch role {
            case .client(let inbound):
                // Stops the journal's watch; a read in progress (on the loop, or the lifeline's
                // drain) releases the reader when it is over.
                inbound.watch.withLock { $0.take() }?.cancel()
                inbound.reader.release()
                _ = unlink(inbound.path)
            case .server(let clientJournalPath, _, let onInvalidated):
                // A dead client cannot remove its own journal.
                if reason.kind == .peerDied { _ = unlink(clientJournalPath) }
                onInvalidated(self)
            }
        }
    }
}
