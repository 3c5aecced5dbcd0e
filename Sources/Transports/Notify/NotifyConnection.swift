import Glibc
import IPCCore
import IPCEngine
import IPCFraming
import IPCPosix
import Synchronization

/// One side of a notify-transport connection: frames go into the outbound ring of the shared
/// store, and a reader thread waits on the inbound ring's data counter, drains every published
/// byte, and reassembles frames. The other side's death is seen through its process (a pidfd);
/// a frame it left half-written dies with the connection, undelivered.
///
/// Requests made back to back read their own replies from the ring while the reader thread
/// parks (``ReceiveOwnership``), so no reply is handed from thread to thread.
public final class NotifyConnection: FrameConnection, @unchecked Sendable {
    // @unchecked: the reassembler is used by one reading thread at a time, as ReceiveOwnership's
    // lock orders; the rings are shared memory reached through atomics; the rest is immutable or a Mutex.
    public let peer: PeerCredentials?

    private let store: NotifyStore
    private let inbound: NotifyStore.Ring
    private let outbound: NotifyStore.Ring
    private let isClient: Bool
    package let core: ConnectionCore
    private let encoder: BinaryFrameEncoder
    /// Held for each frame's write, so frames from concurrent senders never interleave.
    private let sendLock = Mutex(())
    private let replySendTimeout: Duration = .seconds(5)
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    private let onInvalidated: (@Sendable (NotifyConnection) -> Void)?
    /// Used by the thread that currently reads: the reader thread, or a requester reading
    /// directly, as ``ReceiveOwnership`` decides (its lock orders every hand-over).
    private let reassembler: FrameReassembler<BinaryFrameDecoder>

    init(store: NotifyStore, isClient: Bool, peerPID: Int32, options: ConnectionOptions, onInvalidated: (@Sendable (NotifyConnection) -> Void)? = nil) throws {
        self.store = store
        self.isClient = isClient
        self.inbound = isClient ? store.serverToClient : store.clientToServer
        self.outbound = isClient ? store.clientToServer : store.serverToClient
        self.peer = PeerCredentials(pid: peerPID, uid: getuid(), gid: getgid())
        self.core = ConnectionCore(options: options, loop: try EventLoop.shared())
        self.encoder = BinaryFrameEncoder(maximumPayloadLength: options.maximumPayloadLength)
        self.onInvalidated = onInvalidated
        self.reassembler = FrameReassembler(decoder: BinaryFrameDecoder(maximumPayloadLength: options.maximumPayloadLength))
    }

    /// Starts the reader thread and the watch on the peer's process.
    func start() throws {
        do {
            try PosixThread.detach(name: "ipc-notify-read") { [self] in readLoop() }
        } catch {
            finish(InvalidationReason(.transportFailure, error: error as? IPCError))
            throw error
        }
        let pid = peer?.pid ?? 0
        let watch = try ProcessWatcher.shared.watch(pid: pid) { [weak self] in
            self?.invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) exited")))
        }
        peerWatch.withLock { $0 = watch }
    }

    public func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        // Wake our reader, parked or waiting (it finishes the invalidation), and tell the other side.
        core.ownership.stop()
        store.close()
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try await core.request(payload, msgid: msgid, receiveTimeout: receiveTimeout) {
            try sendFrame($0, timeout: sendTimeout)
        } readDirectly: { correlation, deadline in
            self.readDirectly(until: correlation, deadline: deadline)
        }
    }

    /// A requester's direct read (see ``ReceiveOwnership``): drains the inbound ring and
    /// dispatches until request `correlation` is finished. Anything else (the deadline, the end
    /// of the connection, a malformed frame) hands reading back to the reader thread.
    private func readDirectly(until correlation: UInt64, deadline: UInt64) {
        var failed = true
        defer { core.endDirectRead(for: correlation, failed: failed) }
        let reply = cachedReplySender(timeout: replySendTimeout)
        let strategy = core.options.waitStrategy
        while !core.requests.isFinished(correlation) {
            guard core.latch.isValid, store.state != .closed else { return }
            let seen = inbound.data.value
            do {
                try checkIntact()
                if try reassembler.receive({ try inbound.read(into: $0) }) == 0 {
                    if SpinWait.poll(strategy, { inbound.data.value != seen ? true : nil }) == nil {
                        let now = monotonicNanoseconds()
                        guard now < deadline else { return }
                        _ = inbound.data.wait(whileEqualTo: seen, timeoutNanoseconds: min(Int64(clamping: deadline - now), Self.integrityCheckPeriod))
                    }
                    continue
                }
                // A full message buffer: stop, and let the reader thread wait for room.
                if try core.dispatchAll(reassembler.nextFrame, reply: reply, whenFull: .keep) { return }
            } catch {
                invalidate(InvalidationReason(.protocolError, error: error as? IPCError))
                return
            }
        }
        failed = false
    }

    public func sendFrame(_ frame: Frame, timeout: Duration) throws {
        try core.checkValid()
        let (seconds, attoseconds) = timeout.components
        let deadline = monotonicNanoseconds() &+ UInt64(max(0, seconds)) &* 1_000_000_000 &+ UInt64(max(0, attoseconds / 1_000_000_000))
        var written = 0
        do {
            try encoder.withEncodedHeader(FrameHeader(frame)) { headerBytes in
                try sendLock.withLock { _ in
                    try core.checkValid()
                    try frame.payload.withUnsafeBytes { payloadBytes in
                        try outbound.write(header: headerBytes, payload: payloadBytes, deadline: deadline, written: &written) {
                            core.latch.isValid && store.state != .closed
                        }
                    }
                }
            }
        } catch let error as IPCError {
            if error.code == .malformedFrame {
                // The ring's indexes were forged or corrupted: it cannot carry frames any more.
                invalidate(InvalidationReason(.protocolError, error: error))
            } else if written > 0 {
                // Part of a frame is published: the ring cannot carry another frame.
                invalidate(InvalidationReason(.transportFailure, error: error))
            }
            throw error
        }
    }

    /// How long a reader sleeps at most before it looks at the store's header again.
    static let integrityCheckPeriod: Int64 = 1_000_000_000

    /// - Throws: ``IPCError/Code/malformedFrame`` if the store's header was overwritten.
    private func checkIntact() throws {
        guard store.isIntact else {
            throw IPCError(code: .malformedFrame, message: "the notify store \(store.path) was overwritten (its magic or version changed)")
        }
    }

    private func readLoop() {
        let reply = cachedReplySender(timeout: replySendTimeout)
        var reason = InvalidationReason(.invalidatedLocally)
        while true {
            if core.latch.reason?.kind == .invalidatedLocally { break }
            // Dispatch what is buffered first: a requester that read directly may have stopped
            // with whole frames left (when the message buffer filled).
            do {
                try core.dispatchAll(reassembler.nextFrame, reply: reply)
            } catch {
                reason = InvalidationReason(.protocolError, error: error as? IPCError)
                break
            }
            // Requests are following one another: let them read their own replies for a while.
            core.parkReceiveThreadIfRequested()
            let seen = inbound.data.value
            let count: Int
            do {
                try checkIntact()
                count = try reassembler.receive { try inbound.read(into: $0) }
            } catch {
                reason = InvalidationReason(.protocolError, error: error as? IPCError)
                break
            }
            if count == 0 {
                // Everything the peer published has been read; now its end can be acted on.
                if !core.latch.isValid || store.state == .closed {
                    reason = core.latch.reason ?? InvalidationReason(.peerClosed)
                    break
                }
                // Poll the counter for a while under a spinning strategy; then sleep, only if
                // nothing was published since `seen` was read: a post in between changes the
                // counter, and the wait returns at once.
                // The sleep is bounded so that a store overwritten without a post (which wakes
                // nobody) is noticed within ``Self.integrityCheckPeriod``.
                if SpinWait.poll(core.options.waitStrategy, { inbound.data.value != seen ? true : nil }) == nil {
                    inbound.data.wait(whileEqualTo: seen, timeoutNanoseconds: Self.integrityCheckPeriod)
                }
                continue
            }
        }
        finish(reason)
    }

    /// Runs once, on the reader thread (or in `start` if it never ran).
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            if let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
            store.close()
            // Whichever side ends first removes the file; its mapping stays valid for the other.
            unlink(store.path)
            onInvalidated?(self)
        }
    }
}
