import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// One side of a message port conversation.
///
/// A client owns a reply queue, which the process's event loop reads (a POSIX message queue is
/// a pollable descriptor on Linux). On the server, the loop reads the port's queue for all
/// clients and hands each client's fragments to that client's connection. Either way, sends
/// write fragments on the calling thread, under a lock so that one sender's fragments stay
/// contiguous, and the other side's death is seen through its process (a pidfd), since a
/// message queue has no connection to break.
///
/// A task that prefers the loop (``preferredTaskExecutor``) is resumed on the loop's thread
/// right after its reply is read: no reply is handed from thread to thread.
public final class MessagePortConnection: FrameConnection, @unchecked Sendable {
    // @unchecked: `assembler`, `readBuffer`, `readToken`, `paused` and `polled` are touched only by the
    // loop's thread (the one reader); the rest is immutable or behind a Mutex.
    public let peer: PeerCredentials?

    package let core: ConnectionCore
    private let writer: FragmentWriter
    /// The id this side puts in the `sender` field: the client's assigned id, or 0 on the server.
    private let senderID: UInt32
    /// Whose turn it is to write a message's fragments to the outbound queue.
    private let turn: SendTurn
    /// What ``ConnectionOptions/requestHandler``'s tasks reply with: the suspending send. Strong:
    /// the request server lets go of it when the connection finishes.
    private lazy var taskResponder: @Sendable (Frame) async throws -> Void = { [self] frame in
        try await sendFrameSuspending(frame, timeout: replySendTimeout)
    }
    private let replySendTimeout: Duration = .seconds(5)
    private let role: Role
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    private let loop: EventLoop
    /// Touched only by the loop's thread, which reads for this connection.
    private var assembler: FragmentAssembler
    /// A client's receive buffer, one queue message long; touched like ``assembler``.
    private let readBuffer: UnsafeMutableRawBufferPointer
    /// A client's registration of its reply queue with the loop, once reading has started.
    private let readToken = Mutex<UInt64?>(nil)
    /// A client stopped reading because ``MessageConnection/messages`` is full (loop thread only).
    private var paused = false

    enum Role {
        /// The client: its own reply queue (unnamed once the server has opened it), read by the
        /// event loop.
        case client(replyQueue: MessageQueue, endpoint: Endpoint, serverPID: Int32)
        /// The server's view of one client: the listener reads for it and removes it on
        /// invalidation; the client's reply queue name is removed if the client died.
        case server(clientQueueName: String, onInvalidated: @Sendable (MessagePortConnection) -> Void)
    }

    init(peer: PeerCredentials?, outbound: MessageQueue, messageSize: Int, senderID: UInt32, role: Role, options: ConnectionOptions, loop: EventLoop) {
        self.peer = peer
        self.core = ConnectionCore(options: options, loop: loop, loopExecutor: loop)
        self.loop = loop
        self.writer = FragmentWriter(queue: outbound, messageSize: messageSize)
        self.senderID = senderID
        self.role = role
        self.assembler = FragmentAssembler(maximumPayloadLength: options.maximumPayloadLength)
        self.readBuffer = .allocate(byteCount: messageSize, alignment: 8)
        self.turn = SendTurn(deferredLimit: options.messageBufferLimit.bytes)
    }

    deinit {
        readBuffer.deallocate()
    }

    /// Watches the peer's process; its death invalidates the connection.
    func watchPeer(pid: Int32) throws {
        // Strong: the watch is cancelled when the connection finishes, which lets go of it (as
        // the loop's registration does); a weak reference would slow every retain of it.
        let watch = try ProcessWatcher.shared.watch(pid: pid) { [self] in
            invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) exited")))
        }
        peerWatch.withLock { $0 = watch }
        // Ended before the watch was stored (a goodbye read, or the listener closed,
        // meanwhile): `finish` found nothing to cancel, so cancel it here, or the watch would
        // keep this connection until the peer exits.
        if !core.latch.isValid, let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
    }

    /// The name the client's reply queue had until the server opened it.
    var replyQueueName: String? {
        if case .client(let replyQueue, _, _) = role { return replyQueue.name }
        return nil
    }

    public var preferredTaskExecutor: (any TaskExecutor)? { loop }

    /// A client starts reading its reply queue on the loop.
    func startReading(_ replyQueue: MessageQueue) throws {
        let handler = QueueReader(pollsWhileSpinning: core.options.waitStrategy.spins)
        handler.connection = self
        let token = try loop.register(replyQueue.descriptor, interest: .readable, waitStrategy: core.options.waitStrategy, handler: handler)
        readToken.withLock { $0 = token }
    }

    /// Forwards readiness to the connection; the loop's table keeps it, and so the connection,
    /// until invalidation deregisters it (a weak reference would slow every retain of the
    /// connection: see ``EngineConnection``).
    private final class QueueReader: EventHandler, @unchecked Sendable {
        // @unchecked: set once, before the registration can report anything.
        var connection: MessagePortConnection?
        let pollsWhileSpinning: Bool

        init(pollsWhileSpinning: Bool) {
            self.pollsWhileSpinning = pollsWhileSpinning
        }

        var stallLabel: String {
            guard let connection, case .client(_, let endpoint, _) = connection.role else { return "a message-port client's receive path" }
            return "the receive path of a message-port client of \(endpoint.name) and the on-loop handlers it ran"
        }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            guard let connection, case .client(let replyQueue, _, _) = connection.role else { return }
            connection.readQueue(replyQueue)
        }

        func pollWhileSpinning() -> Bool {
            guard let connection, case .client(let replyQueue, _, _) = connection.role else { return false }
            return connection.pollQueue(replyQueue)
        }
    }

    /// What ``pollQueue(_:)`` took from the reply queue (its length in ``readBuffer``, or the
    /// error), for the next ``readQueue(_:)``. Loop thread only.
    private var polled = PolledRead()

    /// The spinning loop's poll (loop thread): takes a message if there is one, as
    /// ``readQueue(_:)`` would, and keeps it for ``readQueue(_:)``, so that a message that
    /// arrives costs one `mq_timedreceive`, as in the spinning C floor.
    private func pollQueue(_ replyQueue: MessageQueue) -> Bool {
        guard core.latch.isValid, !paused else { return false }
        return polled.poll { try replyQueue.receiveIfReady(into: readBuffer) }
    }

    /// Takes one message from the reply queue per readiness report (loop thread): the loop is
    /// level-triggered, so a queue that still holds messages is reported again on its next round
    /// (taking until the queue says it is empty would cost a system call more per message).
    private func readQueue(_ replyQueue: MessageQueue) {
        guard core.latch.isValid, !paused else { return }
        let count: Int?
        do {
            count = try polled.take { try replyQueue.receiveIfReady(into: readBuffer) }
        } catch {
            invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            return
        }
        guard let count else { return }
        if handleQueueMessage(count, whenFull: .keep) == .bufferFull {
            // Stop watching the queue until the application takes a message: the server's sends
            // then wait on a full queue (its backpressure); nothing is dropped.
            pauseReading()
        }
    }

    private func pauseReading() {
        guard let token = readToken.withLock({ $0 }) else { return }
        paused = true
        loop.setInterest(token, [])
        core.whenMessagesHaveRoom { [weak self] in
            guard let self else { return }
            loop.execute {
                guard self.paused, self.core.latch.isValid else { return }
                self.paused = false
                self.loop.setInterest(token, .readable)
            }
        }
    }

    /// On the server's side, the client's reply queue.
    var clientQueueName: String? {
        if case .server(let name, _) = role { return name }
        return nil
    }

    public func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        switch role {
        case .client:
            // The loop reads the reply queue: release it there, between two of its reads.
            if loop.inEventLoop { finish(reason) } else { loop.execute { [self] in finish(reason) } }
        case .server:
            finish(reason)
        }
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

    /// Sends a frame and returns once the queue has all of it. On a thread of the caller's
    /// own it waits there (for its turn, then for room); on the loop's thread it never waits: a
    /// frame the queue cannot take now is kept, in order, and sent by a task (``SendTurn``), and
    /// if that task cannot send it by its deadline, the connection ends (nobody waits to be told).
    public func sendFrame(_ frame: Frame, timeout: Duration) throws {
        let header = try prepare(frame)
        if loop.inEventLoop { return try sendFromLoop(frame, header, timeout: timeout) }
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        guard turn.take(until: deadline) else {
            try core.checkValid()
            if turn.isClosed { throw IPCError(code: .invalidated, message: "the connection is closed") }
            throw IPCError(code: .sendTimeout, message: "other sends held the queue until the send timeout")
        }
        defer { turn.give() }
        var sent = 0
        do {
            try writer.send(header, frame.payload, deadline: MessageQueue.realtimeDeadline(after: .nanoseconds(deadline &- min(deadline, monotonicNanoseconds()))), sent: &sent)
        } catch let error as IPCError {
            tornIf(sent > 0, error)
            throw error
        }
    }

    /// Sends a one-way message, suspending (no thread held) while the queue is full.
    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        try await sendFrameSuspending(Frame(kind: .message, msgid: msgid, payload: payload), timeout: timeout)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        let frame = try core.startRequest(payload, msgid: msgid)
        do {
            try await sendFrameSuspending(frame, timeout: sendTimeout)
        } catch {
            core.requests.cancel(frame.correlation)
            throw error
        }
        return try await core.reply(to: frame, receiveTimeout: receiveTimeout)
    }

    /// The suspending send: takes the turn (at once in the usual case, else suspended in line)
    /// and sends what the queue takes; for the rest, the task waits on the loop for room.
    /// Cancelling the task fails a send none of whose fragments went; one begun is finished.
    private func sendFrameSuspending(_ frame: Frame, timeout: Duration) async throws {
        try Task.checkCancellation()
        let header = try prepare(frame)
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        if !turn.tryTake() {
            guard await turn.take() else { throw IPCError(code: .invalidated, message: "the connection is closed") }
        }
        try await sendHoldingTurn(header, frame.payload, sent: 0, deadline: deadline)
    }

    /// With the turn held: sends the fragments from number `sent` on, waiting on the loop for
    /// room while the queue is full, and gives the turn back.
    private func sendHoldingTurn(_ header: PortFragmentHeader, _ payload: [UInt8], sent: Int, deadline: UInt64) async throws {
        var sent = sent
        while true {
            do {
                if try writer.sendAvailable(header, payload, sent: &sent) { return turn.give() }
            } catch let error as IPCError {
                turn.give()
                tornIf(sent > 0, error)
                throw error
            }
            let outcome: EventLoop.WaitOutcome
            do {
                outcome = try await loop.waitUntil(writer.queue.descriptor, is: .writable, deadline: deadline) { turn.holderWaits(abort: $0) }
            } catch {
                turn.give()
                tornIf(sent > 0, error as? IPCError ?? IPCError(code: .transportFailure, message: "\(error)"))
                throw error
            }
            switch outcome {
            case .ready:
                continue
            case .deadlinePassed:
                turn.give()
                let error = IPCError(code: .sendTimeout, message: "message queue \(writer.queue.name) stayed full until the send timeout; \(sent) fragments of the message sent")
                tornIf(sent > 0, error)
                throw error
            case .cancelled:
                if turn.isClosed {
                    turn.give()
                    throw IPCError(code: .invalidated, message: "the connection closed while the send waited for room")
                }
                guard sent > 0 else {
                    turn.give()
                    throw CancellationError()
                }
                // Begun: finished by a task nobody cancels, or the stream would be torn.
                let rest = sent
                try await Task { try await self.sendHoldingTurn(header, payload, sent: rest, deadline: deadline) }.value
                return
            }
        }
    }

    /// A send from the loop's thread (a handler's reply, a message handler's send): never waits.
    private func sendFromLoop(_ frame: Frame, _ header: PortFragmentHeader, timeout: Duration) throws {
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        if turn.tryTake() {
            var sent = 0
            let done: Bool
            do {
                done = try writer.sendAvailable(header, frame.payload, sent: &sent)
            } catch let error as IPCError {
                turn.give()
                tornIf(sent > 0, error)
                throw error
            }
            if done { return turn.give() }
            if sent > 0 {
                // Begun: a task finishes it with the turn held, or ends the connection.
                Task { [self] in
                    do { try await sendHoldingTurn(header, frame.payload, sent: sent, deadline: deadline) } catch { endUnsent(error) }
                }
                return
            }
            turn.give()
        }
        guard try turn.keep(frame, deadline: deadline) else { return }
        Task { [self] in
            while await turn.take() {
                guard let (kept, keptDeadline) = turn.nextKept() else { return turn.give() }
                do {
                    try await sendHoldingTurn(try prepare(kept), kept.payload, sent: 0, deadline: keptDeadline)
                } catch {
                    endUnsent(error)
                    return
                }
            }
        }
    }

    /// A frame sent from the loop's thread could not be sent by its deadline: nobody waits to be
    /// told, so the connection ends rather than lose it unseen.
    private func endUnsent(_ error: any Error) {
        invalidate(InvalidationReason(.transportFailure, error: error as? IPCError ?? IPCError(code: .transportFailure, message: "\(error)")))
    }

    /// Part of a message is in the queue when a send fails: the receiver would wait for the rest.
    private func tornIf(_ torn: Bool, _ error: IPCError) {
        if torn { invalidate(InvalidationReason(.transportFailure, error: error)) }
    }

    /// Checks that `frame` can be sent now, and makes its first fragment's header.
    private func prepare(_ frame: Frame) throws -> PortFragmentHeader {
        try core.checkValid()
        guard frame.payload.count <= core.options.maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above the maximum of \(core.options.maximumPayloadLength)")
        }
        return PortFragmentHeader(kind: PortMessageKind(frame.kind)!, msgid: frame.msgid, correlation: frame.correlation, sender: senderID)
    }

    /// The server's view of a client: its fragments are read by the listener's thread.
    private var isServer: Bool {
        if case .server = role { return true }
        return false
    }

    /// Handles one fragment addressed to this connection. Called only on the loop's thread.
    /// Returns whether ``MessageConnection/messages``' buffer is full (see
    /// ``ConnectionCore/WhenFull``): a client then stops reading its queue until there is room;
    /// the server's reading of the port queue, which serves every client, cannot wait for one:
    /// it invalidates this connection.
    @discardableResult
    func receive(_ header: PortFragmentHeader, _ bytes: UnsafeRawBufferPointer, whenFull: ConnectionCore.WhenFull = .keep) -> Bool {
        guard core.latch.isValid else { return false }
        switch header.kind {
        case .goodbye:
            invalidate(InvalidationReason(.peerClosed))
        case .hello, .welcome, .wake, .refused:
            break
        case .message, .request, .reply, .failure:
            do {
                // A one-way message in one fragment is offered in place first, from the queue
                // message it arrived in: no copy and no allocation if the handler takes it.
                let offered = header.kind == .message && core.lendsMessages && assembler.isWholeMessage(header, byteCount: bytes.count)
                if offered {
                    let frameHeader = FrameHeader(kind: .message, msgid: header.msgid, correlation: header.correlation, payloadLength: bytes.count)
                    if core.lend(frameHeader, bytes, replyNow: { try sendFrame($0, timeout: replySendTimeout) }) { return false }
                }
                if let frame = try assembler.add(header, bytes) {
                    let full = core.dispatch(
                        frame, replyNow: { try sendFrame($0, timeout: replySendTimeout) },
                        responder: { cachedReplySender(timeout: replySendTimeout) }, whenFull: isServer ? .keep : whenFull, offered: offered,
                        taskResponder: { self.taskResponder }
                    )
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

    /// Releases everything, once, and reports the invalidation last.
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            if let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
            let peerDied = core.latch.reason?.kind == .peerDied
            // Whatever ended this side, unless the other side did (it closed, or died), tell it:
            // a peer whose connection was ended here for a protocol error or a failure would
            // otherwise wait for replies that never come.
            let peerEnded = [.peerClosed, .peerDied].contains(core.latch.reason?.kind)
            // Once nobody writes: now, or when the sender holding the turn gives it back.
            turn.close { [writer, senderID] in
                if !peerEnded {
                    // Without waiting on a full queue: a peer that does not read will not read this.
                    try? writer.sendControl(PortFragmentHeader(kind: .goodbye, sender: senderID), deadline: MessageQueue.realtimeDeadline(after: .zero))
                }
                writer.queue.close()
            }
            switch role {
            case .client(let replyQueue, let endpoint, let serverPID):
                if let token = readToken.withLock({ $0.take() }) { loop.deregister(token) }
                replyQueue.close()
                // Whatever ended this side (the watch may not have fired yet when the application
                // closes first), a dead server cannot remove its queue: remove it unless a
                // successor holds the name.
                if peerDied || !ProcessWatcher.isAlive(pid: serverPID) {
                    EndpointLock.ifUnheld(endpoint) { MessageQueue.unlink(name: PortNames.serverQueue(endpoint)) }
                }
            case .server(let clientQueueName, let onInvalidated):
                // The client gives its reply queue's name up once it reads the welcome; one killed
                // before that cannot. The name is only a rendezvous, so removing it is harmless
                // either way (an open queue stays usable).
                MessageQueue.unlink(name: clientQueueName)
                onInvalidated(self)
            }
        }
    }
}
