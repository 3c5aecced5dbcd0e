import IPCCore
import IPCFraming
import IPCPosix
import Synchronization

/// One `AF_UNIX` stream connection, on either side.
///
/// Sends write the frame on the calling thread (one gathering write of header and payload, under
/// a lock so concurrent senders never interleave frames). A dedicated thread blocks in `read`,
/// reassembles frames and dispatches them: replies complete their requests, requests go to the
/// request handler (whose reply is written from that thread), and messages go to ``messages``.
/// That thread is also the only one that closes the descriptor, so no read ever lands on a
/// descriptor number that was closed and reused.
public final class UnixSocketConnection: MessageConnection, Sendable {
    public let peer: PeerCredentials?
    public let messages: AsyncStream<ReceivedMessage>

    private let fd: CInt
    private let framing: Framing
    private let encoder: any FrameEncoder
    private let options: ConnectionOptions
    private let latch = InvalidationLatch()
    private let requests = RequestTable()
    private let messageSink: AsyncStream<ReceivedMessage>.Continuation
    /// Held for the whole of each frame's write; `true` once the descriptor is closed.
    private let writeState = Mutex(false)
    /// How long the reader thread waits to write a reply before giving up on it.
    private let replySendTimeout: Duration = .seconds(5)
    private let onInvalidated: (@Sendable (UnixSocketConnection) -> Void)?

    init(fd: CInt, peer: PeerCredentials?, framing: Framing, options: ConnectionOptions, onInvalidated: (@Sendable (UnixSocketConnection) -> Void)? = nil) {
        self.fd = fd
        self.peer = peer
        self.framing = framing
        self.options = options
        self.encoder = framing.makeEncoder(maximumPayloadLength: options.maximumPayloadLength)
        self.onInvalidated = onInvalidated
        (messages, messageSink) = AsyncStream.makeStream(of: ReceivedMessage.self)
    }

    /// Starts the reader thread. If it cannot start, the connection is closed and the error thrown.
    func start() throws {
        do {
            try PosixThread.detach(name: "ipc-unix-read") { [self] in readLoop() }
        } catch {
            finishInvalidation(InvalidationReason(.transportFailure, error: error as? IPCError))
            throw error
        }
    }

    public var invalidationReason: InvalidationReason? { latch.reason }

    public func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        latch.setHandler(handler)
    }

    public func invalidate() {
        invalidate(InvalidationReason(.invalidatedLocally))
    }

    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws {
        try sendFrame(FrameHeader(kind: .message, msgid: msgid, correlation: 0, payloadLength: payload.count), payload, timeout: timeout)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try checkValid()
        let correlation = try requests.register()
        do {
            try sendFrame(FrameHeader(kind: .request, msgid: msgid, correlation: correlation, payloadLength: payload.count), payload, timeout: sendTimeout)
        } catch {
            requests.cancel(correlation)
            throw error
        }
        return try await requests.reply(to: correlation, timeout: receiveTimeout)
    }

    private func checkValid() throws {
        if let reason = latch.reason {
            throw IPCError(code: .invalidated, message: "the connection is invalid (\(reason))")
        }
    }

    private func invalidate(_ reason: InvalidationReason) {
        guard latch.invalidate(reason) else { return }
        // Wake the reader thread; it releases everything and reports the invalidation.
        UnixSocket.shutdown(fd)
    }

    private func sendFrame(_ header: FrameHeader, _ payload: [UInt8], timeout: Duration) throws {
        try checkValid()
        var headerBytes: [UInt8] = []
        headerBytes.reserveCapacity(framing == .binary ? BinaryWireFormat.headerLength : 160)
        try encoder.encodeHeader(header, into: &headerBytes)
        let deadline = ContinuousClock.now.advanced(by: timeout)
        var written = 0
        do {
            try writeState.withLock { closed in
                if closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
                try headerBytes.withUnsafeBytes { headerBuffer in
                    try payload.withUnsafeBytes { payloadBuffer in
                        try UnixSocket.sendAll(fd, header: headerBuffer, payload: payloadBuffer, deadline: deadline, written: &written)
                    }
                }
            }
        } catch let error as IPCError {
            if error.code == .peerInvalidated {
                invalidate(InvalidationReason(.peerClosed, error: error))
            } else if error.code == .transportFailure || written > 0 {
                // Part of a frame is on the wire: the stream cannot carry another frame.
                invalidate(InvalidationReason(.transportFailure, error: error))
            }
            throw error
        }
    }

    private func readLoop() {
        let reassembler = framing.makeReassembler(maximumPayloadLength: options.maximumPayloadLength)
        var reason: InvalidationReason
        reading: while true {
            let count: Int
            do {
                count = try reassembler.receive { try UnixSocket.read(fd, into: $0) }
            } catch {
                reason = InvalidationReason(.transportFailure, error: error as? IPCError)
                break reading
            }
            if count == 0 {
                do {
                    try reassembler.finish()
                    reason = InvalidationReason(.peerClosed)
                } catch {
                    reason = InvalidationReason(.protocolError, error: error as? IPCError)
                }
                break reading
            }
            do {
                while let frame = try reassembler.nextFrame() {
                    dispatch(frame)
                }
            } catch {
                reason = InvalidationReason(.protocolError, error: error as? IPCError)
                break reading
            }
        }
        finishInvalidation(reason)
    }

    private func dispatch(_ frame: Frame) {
        switch frame.kind {
        case .message:
            messageSink.yield(ReceivedMessage(msgid: frame.msgid, payload: frame.payload))
        case .request:
            if let handler = options.requestHandler {
                let reply: [UInt8]
                var kind = Frame.Kind.reply
                do {
                    reply = try handler(frame.msgid, frame.payload) ?? []
                } catch {
                    kind = .failure
                    reply = Array(String(describing: error).utf8)
                }
                // A reply that cannot be written is the requester's timeout to report; a torn one
                // has already invalidated the connection.
                try? sendFrame(FrameHeader(kind: kind, msgid: frame.msgid, correlation: frame.correlation, payloadLength: reply.count), reply, timeout: replySendTimeout)
            } else {
                let timeout = replySendTimeout
                messageSink.yield(ReceivedMessage(msgid: frame.msgid, payload: frame.payload, correlation: frame.correlation) { [weak self] reply in
                    guard let self else { throw IPCError(code: .invalidated, message: "the connection is gone") }
                    try self.sendFrame(FrameHeader(reply), reply.payload, timeout: timeout)
                })
            }
        case .reply:
            requests.complete(frame.correlation, with: .success(frame.payload))
        case .failure:
            let description = String(decoding: frame.payload, as: UTF8.self)
            requests.complete(frame.correlation, with: .failure(IPCError(code: .transportFailure, message: "the peer's request handler failed: \(description)")))
        }
    }

    /// Runs once, on the reader thread (or in `start` if it never ran): releases the descriptor,
    /// ends the message stream, fails pending requests, and reports the invalidation last.
    private func finishInvalidation(_ reason: InvalidationReason) {
        _ = latch.invalidate(reason)
        let final = latch.reason ?? reason
        writeState.withLock { closed in
            closed = true
            closeDescriptor(fd)
        }
        messageSink.finish()
        requests.close(with: IPCError(code: .peerInvalidated, message: "the connection became invalid: \(final)"))
        onInvalidated?(self)
        latch.complete()
    }
}
