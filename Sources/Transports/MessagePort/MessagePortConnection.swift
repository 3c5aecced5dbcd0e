import Glibc
import IPCCore
import IPCPosix
import Synchronization

/// One side of a message port conversation.
///
/// A client owns a reply queue and a thread that blocks in `mq_receive` on it. On the server,
/// one thread reads the port's queue for all clients and hands each client's fragments to that
/// client's connection. Either way, sends write fragments on the calling thread, under a lock so
/// that one sender's fragments stay contiguous, and the other side's death is seen through its
/// process (a pidfd), since a message queue has no connection to break.
public final class MessagePortConnection: FrameConnection, @unchecked Sendable {
    public let peer: PeerCredentials?

    public let core: ConnectionCore
    private let writer: FragmentWriter
    /// The id this side puts in the `sender` field: the client's assigned id, or 0 on the server.
    private let senderID: UInt32
    /// Held for each message's fragments; `true` once the outbound queue is closed.
    private let sendState = Mutex(false)
    private let replySendTimeout: Duration = .seconds(5)
    private let role: Role
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    /// Touched only by the thread that reads for this connection.
    private var assembler: FragmentAssembler

    enum Role {
        /// The client: its own reply queue (read by its reader thread, and a write descriptor to
        /// wake that thread), which it removes when it ends.
        case client(replyQueue: MessageQueue, wakeWriter: MessageQueue, endpoint: Endpoint)
        /// The server's view of one client: the listener reads for it and removes it on
        /// invalidation; the client's reply queue name is removed if the client died.
        case server(clientQueueName: String, onInvalidated: @Sendable (MessagePortConnection) -> Void)
    }

    init(peer: PeerCredentials?, outbound: MessageQueue, messageSize: Int, senderID: UInt32, role: Role, options: ConnectionOptions) {
        self.peer = peer
        self.core = ConnectionCore(options: options)
        self.writer = FragmentWriter(queue: outbound, messageSize: messageSize)
        self.senderID = senderID
        self.role = role
        self.assembler = FragmentAssembler(maximumPayloadLength: options.maximumPayloadLength)
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
            // The reader thread releases everything; wake it with a message in its own queue.
            try? FragmentWriter(queue: wakeWriter, messageSize: writer.messageSize)
                .sendControl(PortFragmentHeader(kind: .wake), deadline: MessageQueue.realtimeDeadline(after: .seconds(1)))
        case .server:
            finish(reason)
        }
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

    /// Handles one fragment addressed to this connection. Called only by its reading thread.
    func receive(_ header: PortFragmentHeader, _ bytes: UnsafeRawBufferPointer) {
        guard core.latch.isValid else { return }
        switch header.kind {
        case .goodbye:
            invalidate(InvalidationReason(.peerClosed))
        case .hello, .welcome, .wake:
            break
        case .message, .request, .reply, .failure:
            do {
                if let frame = try assembler.add(header, bytes) {
                    core.dispatch(frame, reply: replySender(timeout: replySendTimeout))
                }
            } catch {
                invalidate(InvalidationReason(.protocolError, error: error as? IPCError))
            }
        }
    }

    /// The client's reader thread: runs until a wake after invalidation, or a queue failure.
    func clientReadLoop(replyQueue: MessageQueue) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: writer.messageSize, alignment: 8)
        defer { buffer.deallocate() }
        var reason = InvalidationReason(.invalidatedLocally)
        while core.latch.isValid {
            let count: Int
            do {
                count = try SpinWait.poll(core.options.waitStrategy) { try replyQueue.receiveIfReady(into: buffer) }
                    ?? replyQueue.receive(into: buffer)
            } catch {
                reason = InvalidationReason(.transportFailure, error: error as? IPCError)
                break
            }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[..<count])
            guard let header = try? PortFragmentHeader(parsing: bytes) else {
                reason = InvalidationReason(.protocolError, error: IPCError(code: .malformedFrame, message: "malformed message in the reply queue"))
                break
            }
            receive(header, UnsafeRawBufferPointer(rebasing: bytes[PortFragmentHeader.length...]))
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
