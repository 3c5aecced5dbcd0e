import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// One side of a message port conversation.
///
/// A client owns a reply queue and a thread that blocks in `mq_receive` on it. On the server,
/// one thread reads the port's queue for all clients and hands each client's fragments to that
/// client's connection. Either way, sends write fragments on the calling thread, under a lock so
/// that one sender's fragments stay contiguous, and the other side's death is seen through its
/// process (a pidfd), since a message queue has no connection to break.
///
/// A client's requests made back to back read their own replies from the reply queue while the
/// reader thread parks (``ReceiveOwnership``), so no reply is handed from thread to thread.
public final class MessagePortConnection: FrameConnection, @unchecked Sendable {
    public let peer: PeerCredentials?

    package let core: ConnectionCore
    private let writer: FragmentWriter
    /// The id this side puts in the `sender` field: the client's assigned id, or 0 on the server.
    private let senderID: UInt32
    /// Held for each message's fragments; `true` once the outbound queue is closed.
    private let sendState = Mutex(false)
    private let replySendTimeout: Duration = .seconds(5)
    private let role: Role
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    /// Touched only by the thread that reads for this connection (on a client, the reader thread
    /// or a requester reading directly, as ``ReceiveOwnership`` decides).
    private var assembler: FragmentAssembler
    /// A client's receive buffer, one queue message long; touched like ``assembler``.
    private let readBuffer: UnsafeMutableRawBufferPointer

    enum Role {
        /// The client: its own reply queue (read by its reader thread, and a write descriptor to
        /// wake that thread), which it removes when it ends.
        case client(replyQueue: MessageQueue, wakeWriter: MessageQueue, endpoint: Endpoint)
        /// The server's view of one client: the listener reads for it and removes it on
        /// invalidation; the client's reply queue name is removed if the client died.
        case server(clientQueueName: String, onInvalidated: @Sendable (MessagePortConnection) -> Void)
    }

    init(peer: PeerCredentials?, outbound: MessageQueue, messageSize: Int, senderID: UInt32, role: Role, options: ConnectionOptions, loop: EventLoop) {
        self.peer = peer
        self.core = ConnectionCore(options: options, loop: loop)
        self.writer = FragmentWriter(queue: outbound, messageSize: messageSize)
        self.senderID = senderID
        self.role = role
        self.assembler = FragmentAssembler(maximumPayloadLength: options.maximumPayloadLength)
        self.readBuffer = .allocate(byteCount: messageSize, alignment: 8)
    }

    deinit {
        readBuffer.deallocate()
    }

    /// Watches the peer's process; its death invalidates the connection.
    func watchPeer(pid: Int32) throws {
        let watch = try ProcessWatcher.shared.watch(pid: pid) { [weak self] in
            self?.invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) exited")))
        }
        peerWatch.withLock { $0 = watch }
    }

    /// The client's reply queue, which it removes when it ends.
    var replyQueueName: String? {
        if case .client(let replyQueue, _, _) = role { return replyQueue.name }
        return nil
    }

    /// On the server's side, the client's reply queue.
    var clientQueueName: String? {
        if case .server(let name, _) = role { return name }
        return nil
    }

    public func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        switch role {
        case .client(_, let wakeWriter, _):
            // The reader thread releases everything; wake it, parked or reading (with a message
            // in its own queue). A requester reading directly sees the invalidation and hands back.
            core.ownership.stop()
            try? FragmentWriter(queue: wakeWriter, messageSize: writer.messageSize)
                .sendControl(PortFragmentHeader(kind: .wake), deadline: MessageQueue.realtimeDeadline(after: .seconds(1)))
        case .server:
            finish(reason)
        }
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        guard case .client(let replyQueue, _, _) = role else {
            return try await core.request(payload, msgid: msgid, receiveTimeout: receiveTimeout) { try sendFrame($0, timeout: sendTimeout) }
        }
        return try await core.request(payload, msgid: msgid, receiveTimeout: receiveTimeout) {
            try sendFrame($0, timeout: sendTimeout)
        } readDirectly: { correlation, deadline in
            self.readDirectly(replyQueue, until: correlation, deadline: deadline)
        }
    }

    /// A client requester's direct read (see ``ReceiveOwnership``): takes queue messages and
    /// handles them until request `correlation` is finished. Anything else (the deadline, an
    /// invalidation, a queue failure) hands reading back to the reader thread.
    private func readDirectly(_ replyQueue: MessageQueue, until correlation: UInt64, deadline: UInt64) {
        var failed = true
        defer { core.endDirectRead(for: correlation, failed: failed) }
        let strategy = core.options.waitStrategy
        while !core.requests.isFinished(correlation) {
            guard core.latch.isValid else { return }
            let count: Int
            do {
                if let ready = try SpinWait.poll(strategy, { try replyQueue.receiveIfReady(into: readBuffer) }) {
                    count = ready
                } else {
                    let now = monotonicNanoseconds()
                    guard now < deadline,
                        let received = try replyQueue.receive(into: readBuffer, deadline: MessageQueue.realtimeDeadline(after: .nanoseconds(Int64(clamping: deadline - now))))
                    else { return }
                    count = received
                }
            } catch {
                return
            }
            // A full message buffer: stop, and let the reader thread wait for room.
            guard handleQueueMessage(count, whenFull: .keep) == .handled else { return }
        }
        failed = false
    }

    /// Parses and handles one message of `count` bytes in ``readBuffer``: `.malformed` (after
    /// invalidating the connection) if it does not parse, `.bufferFull` if ``MessageConnection/messages``
    /// is full after it (only with `whenFull: .keep`).
    private func handleQueueMessage(_ count: Int, whenFull: ConnectionCore.WhenFull) -> QueueMessageOutcome {
        let bytes = UnsafeRawBufferPointer(rebasing: readBuffer[..<count])
        guard let header = try? PortFragmentHeader(parsing: bytes) else {
            invalidate(InvalidationReason(.protocolError, error: IPCError(code: .malformedFrame, message: "malformed message in the reply queue")))
            return .malformed
        }
        return receive(header, UnsafeRawBufferPointer(rebasing: bytes[PortFragmentHeader.length...]), whenFull: whenFull) ? .bufferFull : .handled
    }

    private enum QueueMessageOutcome {
        case handled, bufferFull, malformed
    }

    public func sendFrame(_ frame: Frame, timeout: Duration) throws {
        try core.checkValid()
        guard frame.payload.count <= core.options.maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above the maximum of \(core.options.maximumPayloadLength)")
        }
        let header = PortFragmentHeader(kind: PortMessageKind(frame.kind)!, msgid: frame.msgid, correlation: frame.correlation, sender: senderID)
        let deadline = MessageQueue.realtimeDeadline(after: timeout)
        var sent = 0
        do {
            try sendState.withLock { closed in
                if closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
                try writer.send(header, frame.payload, deadline: deadline, sent: &sent)
            }
        } catch let error as IPCError {
            if sent > 0 {
                // Part of a message is in the queue: the receiver would wait for the rest.
                invalidate(InvalidationReason(.transportFailure, error: error))
            }
            throw error
        }
    }

    /// The server's view of a client: its fragments are read by the listener's thread.
    private var isServer: Bool {
        if case .server = role { return true }
        return false
    }

    /// Handles one fragment addressed to this connection. Called only by its reading thread.
    /// Returns whether ``MessageConnection/messages``' buffer is full (see
    /// ``ConnectionCore/WhenFull``): the client's reader thread waits for room (`.wait`); a
    /// requester reading directly (`.keep`) then hands reading back; the server's listener
    /// thread, which reads for every client, cannot wait for one: it invalidates this connection.
    @discardableResult
    func receive(_ header: PortFragmentHeader, _ bytes: UnsafeRawBufferPointer, whenFull: ConnectionCore.WhenFull = .wait) -> Bool {
        guard core.latch.isValid else { return false }
        switch header.kind {
        case .goodbye:
            invalidate(InvalidationReason(.peerClosed))
        case .hello, .welcome, .wake:
            break
        case .message, .request, .reply, .failure:
            do {
                if let frame = try assembler.add(header, bytes) {
                    let full = core.dispatch(frame, reply: cachedReplySender(timeout: replySendTimeout), whenFull: isServer ? .keep : whenFull)
                    if full, isServer {
                        invalidate(InvalidationReason(.transportFailure, error: .receiveBufferFull))
                    }
                    return full
                }
            } catch {
                invalidate(InvalidationReason(.protocolError, error: error as? IPCError))
            }
        }
        return false
    }

    /// The client's reader thread: runs until a wake after invalidation, or a queue failure.
    func clientReadLoop(replyQueue: MessageQueue) {
        var reason = InvalidationReason(.invalidatedLocally)
        while core.latch.isValid {
            let count: Int
            do {
                count = try SpinWait.poll(core.options.waitStrategy) { try replyQueue.receiveIfReady(into: readBuffer) }
                    ?? replyQueue.receive(into: readBuffer)
            } catch {
                reason = InvalidationReason(.transportFailure, error: error as? IPCError)
                break
            }
            guard handleQueueMessage(count, whenFull: .wait) != .malformed else {
                reason = core.latch.reason ?? InvalidationReason(.protocolError)
                break
            }
            // Requests are following one another: let them read their own replies for a while.
            core.parkReceiveThreadIfRequested()
        }
        finish(reason)
    }

    /// Releases everything, once, and reports the invalidation last.
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            if let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
            let peerDied = core.latch.reason?.kind == .peerDied
            let locallyEnded = core.latch.reason?.kind == .invalidatedLocally
            sendState.withLock { closed in
                if locallyEnded {
                    // Tell the other side, without waiting on a full queue.
                    try? writer.sendControl(PortFragmentHeader(kind: .goodbye, sender: senderID), deadline: MessageQueue.realtimeDeadline(after: .milliseconds(50)))
                }
                closed = true
                writer.queue.close()
            }
            switch role {
            case .client(let replyQueue, let wakeWriter, let endpoint):
                replyQueue.close()
                wakeWriter.close()
                MessageQueue.unlink(name: replyQueue.name)
                if peerDied {
                    // A dead server cannot remove its queue; remove it unless a successor holds the name.
                    EndpointLock.ifUnheld(endpoint) { MessageQueue.unlink(name: PortNames.serverQueue(endpoint)) }
                }
            case .server(let clientQueueName, let onInvalidated):
                // A dead client cannot remove its own reply queue.
                if peerDied { MessageQueue.unlink(name: clientQueueName) }
                onInvalidated(self)
            }
        }
    }
}
