import IPCCore

/// The part of a connection that is the same in every transport: the invalidation latch, the
/// pending requests, the stream of received messages, and what each kind of incoming frame
/// means. ``EngineConnection`` drives it from the event loop; the transports that still read on
/// threads of their own drive it from there. Never reachable by users of a connection: whoever
/// can dispatch a frame can complete another's request.
package final class ConnectionCore: Sendable {
    package let options: ConnectionOptions
    package let latch = InvalidationLatch()
    package let requests: RequestTable
    /// How the receive path sends replies; see ``ReplyRoute``.
    package let replyRoute = ReplyRoute()
    package let messages: AsyncStream<ReceivedMessage>
    private let buffer: MessageBuffer
    /// This connection's ``ConnectionOptions/makeOnLoopMessageHandler`` product.
    private let messageHandler: MessageHandler?
    /// This connection's ``ConnectionOptions/makeOnLoopBorrowingMessageHandler`` product.
    private let borrowingHandler: BorrowingMessageHandler?
    /// Runs ``ConnectionOptions/requestHandler`` off the receive path, unless the fast path
    /// (``ConnectionOptions/onLoopRequestHandler``) answers instead.
    private let requestServer: RequestServer?

    /// - Parameter loopExecutor: the executor of the loop that reads for this connection, for
    ///   ``RequestHandlerExecutor/eventLoop``; `nil` if the transport reads on a thread of its
    ///   own (the handler's tasks then run on the global executor).
    package init(options: ConnectionOptions, loop: EventLoop, loopExecutor: (any TaskExecutor)? = nil) {
        self.options = options
        requests = RequestTable(loop: loop)
        let buffer = MessageBuffer(limit: options.messageBufferLimit)
        self.buffer = buffer
        messages = AsyncStream(unfolding: { await buffer.next() })
        messageHandler = options.makeOnLoopMessageHandler?()
        borrowingHandler = options.makeOnLoopBorrowingMessageHandler?()
        if options.onLoopRequestHandler == nil, let handler = options.requestHandler {
            let executor: (any TaskExecutor)? = switch options.requestHandlerExecutor {
            case .global: nil
            case .eventLoop: loopExecutor
            case .custom(let executor): executor
            }
            requestServer = RequestServer(
                handler: handler, concurrency: options.maximumConcurrentRequests, limit: options.messageBufferLimit, executor: executor
            )
        } else {
            requestServer = nil
        }
    }

    /// Whether one-way messages are offered in place first (``lend(_:_:replyNow:)``).
    package var lendsMessages: Bool { borrowingHandler != nil }

    /// Offers a frame's payload, in place, to the borrowing message handler: whether it took it.
    /// Only one-way messages are offered. `replyNow` as for ``dispatch(_:replyNow:responder:whenFull:offered:taskResponder:)``.
    @inline(__always)
    package func lend(_ header: FrameHeader, _ payload: UnsafeRawBufferPointer, replyNow: (Frame) throws -> Void) -> Bool {
        guard header.kind == .message, let borrowingHandler else { return false }
        return borrowingHandler(header.msgid, RawSpan(_unsafeBytes: payload)) { payload, msgid in
            try replyNow(Frame(kind: .message, msgid: msgid, payload: payload))
        }
    }

    /// Messages received and not yet taken from ``messages`` (at most
    /// ``ConnectionOptions/messageBufferLimit``, but for a receive path that cannot wait).
    package var bufferedMessageCount: Int { buffer.count }

    /// Whether a dispatch with ``WhenFull/wait`` of a message for ``messages`` would wait for
    /// the application now. Exact for the one thread that dispatches: only it adds messages.
    package var dispatchWouldWait: Bool { buffer.pushWouldWait }

    /// Runs `handler` once ``messages``' buffer, and the queue of requests waiting for the
    /// request handler, have room (at once if they have). Only the receive path adds to
    /// either, and it waits for this: once both had room, both still have.
    package func whenMessagesHaveRoom(_ handler: @escaping @Sendable () -> Void) {
        guard let requestServer else { return buffer.whenRoom(handler) }
        requestServer.whenRoom { [buffer] in buffer.whenRoom(handler) }
    }

    /// - Throws: ``IPCError/Code/invalidated`` if the connection is no longer valid.
    package func checkValid() throws {
        if let reason = latch.reason {
            throw IPCError(code: .invalidated, message: "the connection is invalid (\(reason))")
        }
    }

    /// Starts a request: checks that the connection is valid, registers the request and makes
    /// its frame. Send the frame, then wait with ``reply(to:receiveTimeout:)``; if the send
    /// fails, ``RequestTable/cancel(_:)`` the frame's correlation.
    /// - Throws: the invalidation error.
    package func startRequest(_ payload: [UInt8], msgid: UInt32) throws -> Frame {
        try checkValid()
        return Frame(kind: .request, msgid: msgid, correlation: try requests.register(), payload: payload)
    }

    /// Waits for the reply to `request`, whose frame was sent (suspended: the thread that reads
    /// the reply resumes the request).
    @inline(__always)
    package func reply(to request: Frame, receiveTimeout: Duration) async throws -> [UInt8] {
        try await requests.reply(to: request.correlation, timeout: receiveTimeout, strategy: options.waitStrategy)
    }

    /// The request/reply flow for a send that may suspend: ``startRequest(_:msgid:)``, `send`,
    /// ``reply(to:receiveTimeout:)``. A connection whose send usually does not suspend calls
    /// the steps itself, so that the common case makes no async call for the send.
    package func request(
        _ payload: [UInt8],
        msgid: UInt32,
        receiveTimeout: Duration,
        send: (Frame) async throws -> Void
    ) async throws -> [UInt8] {
        let frame = try startRequest(payload, msgid: msgid)
        do {
            try await send(frame)
        } catch {
            requests.cancel(frame.correlation)
            throw error
        }
        return try await reply(to: frame, receiveTimeout: receiveTimeout)
    }

    /// What ``dispatch(_:replyNow:responder:whenFull:offered:taskResponder:)`` does with a message for ``messages`` while that
    /// buffer is full (``ConnectionOptions/messageBufferLimit``).
    package enum WhenFull: Sendable {
        /// Wait until the application takes one: the backpressure of a receive thread of its own.
        case wait
        /// Add it anyway, and say so: for a receive path that stops reading this connection
        /// until there is room (the event loop), and for one that serves several connections
        /// (which then invalidates this one with ``IPCError/Code/receiveBufferFull``).
        case keep
    }

    /// Acts on one incoming frame; returns whether ``messages``' buffer (or the queue of
    /// requests waiting for the request handler) is full. The uses of a reply sender are apart:
    /// `replyNow` answers on the calling thread (an on-loop handler's reply, a message
    /// handler's send), and
    /// `responder` makes the sender a request delivered through ``messages`` keeps, only when one
    /// is. A connection can then answer its handlers through itself without a weak reference,
    /// whose side table would send every retain of the connection down the runtime's slow path.
    /// `offered`: the frame was already offered to the borrowing handler (which did not take it).
    /// `taskResponder` makes the sender that ``ConnectionOptions/requestHandler``'s tasks reply
    /// with (once per connection): the connection's suspending send.
    @discardableResult
    package func dispatch(
        _ frame: Frame, replyNow: (Frame) throws -> Void, responder: () -> @Sendable (Frame) throws -> Void, whenFull: WhenFull = .wait, offered: Bool = false,
        taskResponder: () -> @Sendable (Frame) async throws -> Void
    ) -> Bool {
        switch frame.kind {
        case .message:
            if !offered, borrowingHandler != nil,
                frame.payload.withUnsafeBytes({ lend(FrameHeader(frame), $0, replyNow: replyNow) })
            {
                return false
            }
            let message = ReceivedMessage(msgid: frame.msgid, payload: frame.payload)
            if let messageHandler, messageHandler(message, { payload, msgid in try replyNow(Frame(kind: .message, msgid: msgid, payload: payload)) }) {
                return false
            }
            return buffer.push(message, waitForRoom: whenFull == .wait)
        case .request:
            if let requestServer {
                return requestServer.accept(frame, send: taskResponder, waitForRoom: whenFull == .wait)
            }
            guard let handler = options.onLoopRequestHandler else {
                let message = ReceivedMessage(msgid: frame.msgid, payload: frame.payload, correlation: frame.correlation, responder: responder())
                return buffer.push(message, waitForRoom: whenFull == .wait)
            }
            var answer = Frame(kind: .reply, msgid: frame.msgid, correlation: frame.correlation)
            do {
                answer.payload = try handler(frame.msgid, frame.payload) ?? []
            } catch {
                answer.kind = .failure
                answer.payload = Array(String(describing: error).utf8)
            }
            // A reply that cannot be sent is the requester's timeout to report; a torn one has
            // already invalidated the connection.
            try? replyNow(answer)
        case .reply:
            requests.complete(frame.correlation, with: .success(frame.payload))
        case .failure:
            let description = String(decoding: frame.payload, as: UTF8.self)
            requests.complete(frame.correlation, with: .failure(IPCError(code: .transportFailure, message: "the peer's request handler failed: \(description)")))
        }
        return false
    }

    /// Ends the connection, once: records `reason` unless another reason was recorded first,
    /// lets the transport release its resources, ends the message stream, fails pending
    /// requests, and runs the invalidation handler last.
    package func finish(_ reason: InvalidationReason, releasingResources release: () -> Void) {
        _ = latch.invalidate(reason)
        let final = latch.reason ?? reason
        release()
        requestServer?.close()
        buffer.finish()
        requests.close(with: IPCError(code: .peerInvalidated, message: "the connection became invalid: \(final)"))
        latch.complete()
    }
}

/// Keeps a connection's reply sender once it is made: making one forms a weak reference to the
/// connection, and a reply sender per frame costs an allocation and sends every later retain of
/// the connection down the runtime's slow path. Used only by the thread that reads for the
/// connection.
package final class ReplyRoute: @unchecked Sendable {
    // @unchecked: one thread at a time reads for a connection, and only that thread uses this.
    private var send: (@Sendable (Frame) throws -> Void)?

    package init() {}

    /// The sender, made by `make` the first time.
    package func sender(_ make: () -> @Sendable (Frame) throws -> Void) -> @Sendable (Frame) throws -> Void {
        // `if let`, not `??`: a closure passed through a generic operator comes back wrapped in
        // conversion thunks, and stored back it would grow a layer per frame.
        if let send { return send }
        let made = make()
        send = made
        return made
    }
}

/// A connection built on ``ConnectionCore``: it provides how a frame is sent and how an
/// invalidation starts; the rest of ``MessageConnection`` comes from here, so every transport
/// behaves the same way.
package protocol FrameConnection: MessageConnection {
    var core: ConnectionCore { get }

    /// Sends one frame whole, or throws without having sent any of it (a torn frame must
    /// invalidate the connection before the error is thrown).
    func sendFrame(_ frame: Frame, timeout: Duration) throws

    /// Starts invalidation with `reason`, if the connection is still valid.
    func invalidate(_ reason: InvalidationReason)
}

extension FrameConnection {
    public var messages: AsyncStream<ReceivedMessage> { core.messages }

    public var invalidationReason: InvalidationReason? { core.latch.reason }

    public func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        core.latch.setHandler(handler)
    }

    public func invalidate() {
        invalidate(InvalidationReason(.invalidatedLocally))
    }

    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws {
        try sendFrame(Frame(kind: .message, msgid: msgid, payload: payload), timeout: timeout)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        let frame = try core.startRequest(payload, msgid: msgid)
        do {
            try sendFrame(frame, timeout: sendTimeout)
        } catch {
            core.requests.cancel(frame.correlation)
            throw error
        }
        return try await core.reply(to: frame, receiveTimeout: receiveTimeout)
    }

    /// The connection's reply sender (``replySender(timeout:)``), made once; for the thread
    /// that reads.
    package func cachedReplySender(timeout: Duration) -> @Sendable (Frame) throws -> Void {
        core.replyRoute.sender { replySender(timeout: timeout) }
    }

    /// Sends `frame` as a reply from the receive path, through a weak reference so that a
    /// request delivered through ``MessageConnection/messages`` does not keep its connection alive.
    package func replySender(timeout: Duration) -> @Sendable (Frame) throws -> Void {
        { [weak self] frame in
            guard let self else { throw IPCError(code: .invalidated, message: "the connection is gone") }
            try self.sendFrame(frame, timeout: timeout)
        }
    }
}

extension Sequence where Element: FrameConnection {
    /// Sends a one-way message to every connection and returns how many took it. A connection
    /// whose send fails is invalidated; the others still get the message.
    package func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        reduce(0) { delivered, connection in
            do {
                try connection.send(payload, msgid: msgid, timeout: timeout)
                return delivered + 1
            } catch {
                connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
                return delivered
            }
        }
    }
}
