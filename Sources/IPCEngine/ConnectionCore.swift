package import IPCCore

/// The part of a connection that is the same in every transport: the invalidation latch, the
/// pending requests, the stream of received messages, and what each kind of incoming frame
/// means. ``EngineConnection``, every transport's connection, drives it from the event loop.
/// Never reachable by users of a connection: whoever can dispatch a frame can complete
/// another's request.
package final class ConnectionCore: Sendable {
    /// How a full listener's refusal text begins (docs/WIRE-FORMAT.md, "Refusal").
    package static let busyRefusalPrefix = "endpointNotFound:"

    package let options: ConnectionOptions
    package let latch = InvalidationLatch()
    package let requests: RequestTable
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
    ///   ``RequestHandlerExecutor/eventLoop``.
    package init(options: ConnectionOptions, loop: EventLoop, loopExecutor: any TaskExecutor) {
        self.options = options
        requests = RequestTable(loop: loop)
        let buffer = MessageBuffer(limit: options.messageBufferLimit)
        self.buffer = buffer
        messages = AsyncStream(unfolding: { await buffer.next() })
        messageHandler = options.makeOnLoopMessageHandler?()
        borrowingHandler = options.makeOnLoopBorrowingMessageHandler?()
        if options.onLoopRequestHandler == nil, let handler = options.requestHandler {
            let executor: (any TaskExecutor)? = switch options.requestHandlerExecutor {
            case .servingThreads: ServingExecutor.shared
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
    /// Only one-way messages are offered. `replyNow` as for ``dispatch(_:replyNow:responder:offered:taskResponder:)``.
    @inline(__always)
    package func lend(_ header: FrameHeader, _ payload: UnsafeRawBufferPointer, replyNow: (Frame) throws -> Void) -> Bool {
        guard header.kind == .message, let borrowingHandler else { return false }
        return borrowingHandler(header.msgid, RawSpan(_unsafeBytes: payload)) { payload, msgid in
            try replyNow(Frame(kind: .message, msgid: msgid, payload: payload))
        }
    }

    /// Messages received and not yet taken from ``messages`` (at most
    /// ``ConnectionOptions/messageBufferLimit``, and one more when the receive path stops).
    package var bufferedMessageCount: Int { buffer.count }

    /// Runs `handler` once ``messages``' buffer, and the queue of requests waiting for the
    /// request handler, have room (at once if they have). Only the receive path adds to
    /// either, and it waits for this: once both had room, both still have.
    package func whenMessagesHaveRoom(_ handler: @escaping @Sendable () -> Void) {
        guard let requestServer else { return buffer.whenRoom(handler) }
        requestServer.whenRoom { [buffer] in buffer.whenRoom(handler) }
    }

    /// - Throws: ``IPCError/Code/invalidated`` if the connection is no longer valid.
    package func checkValid() throws {
        // The usual answer without making and destroying an optional reason (twice a request).
        guard !latch.isValid, let reason = latch.reason else { return }
        if let refusal = reason.refusal { throw refusal }
        throw IPCError(code: .invalidated, message: "the connection is invalid (\(reason))")
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
    package nonisolated(nonsending) func reply(to request: Frame, receiveTimeout: Duration) async throws -> [UInt8] {
        try await requests.reply(to: request.correlation, timeout: receiveTimeout, strategy: options.waitStrategy)
    }

    /// Acts on one incoming frame; returns whether ``messages``' buffer (or the queue of
    /// requests waiting for the request handler) is full: the receive path then stops reading
    /// this connection until there is room (``whenMessagesHaveRoom(_:)``), or, if it serves
    /// several connections and cannot stop for one, ends it. The uses of a reply sender are apart:
    /// `replyNow` answers on the calling thread (an on-loop handler's reply, a message
    /// handler's send), and
    /// `responder` makes the sender a request delivered through ``messages`` keeps, only when one
    /// is. A connection can then answer its handlers through itself without a weak reference,
    /// whose side table would send every retain of the connection down the runtime's slow path.
    /// `offered`: the frame was already offered to the borrowing handler (which did not take it).
    /// `taskResponder` makes the sender that ``ConnectionOptions/requestHandler``'s tasks reply
    /// with (once per connection): the connection's send, which writes what it can at once and
    /// returns the suspending rest, if any (``RequestServer/ReplySender``).
    @discardableResult
    package func dispatch(
        _ frame: Frame, replyNow: (Frame) throws -> Void, responder: () -> @Sendable (Frame) throws -> Void, offered: Bool = false,
        taskResponder: () -> @Sendable (Frame) throws -> (@Sendable () async throws -> Void)?
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
            return buffer.push(message)
        case .request:
            if let requestServer {
                return requestServer.accept(frame, send: taskResponder)
            }
            guard let handler = options.onLoopRequestHandler else {
                let message = ReceivedMessage(msgid: frame.msgid, payload: frame.payload, correlation: frame.correlation, responder: responder())
                return buffer.push(message)
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
            if frame.correlation == 0 {
                // No request has correlation 0: the listener refused this connection (its accept
                // filter, or it was full), and closes it next. The receive path ends the
                // connection. A full listener's refusal says `endpointNotFound:` first (try
                // again later); any other is `accessDenied` (docs/WIRE-FORMAT.md, "Refusal").
                let message = "the listener refused this connection (\(description))"
                let refusal = description.hasPrefix(Self.busyRefusalPrefix) ? IPCError.listenerBusy(message) : IPCError(code: .accessDenied, message: message)
                _ = latch.invalidate(InvalidationReason(.peerClosed, error: refusal))
                return false
            }
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
        requests.close(with: final.refusal ?? IPCError(code: .peerInvalidated, message: "the connection became invalid: \(final)"))
        latch.complete()
    }
}

extension InvalidationReason {
    /// The listener's refusal, for a connection that ended because the listener refused it
    /// (what its requests and later calls fail with): its accept filter's (`accessDenied`), or
    /// a full listener's (`endpointNotFound`, which nothing else ends a connection with).
    var refusal: IPCError? {
        guard let error, error.code == .accessDenied || (kind == .peerClosed && error.code == .endpointNotFound) else { return nil }
        return error
    }
}
