import Foundation
import IPCCore
import Synchronization

/// One end of a toy connection. A thread of its own blocks in `recv` and dispatches each packet;
/// it is also the only thread that closes the socket, after the connection is invalidated.
public final class ToyConnection: MessageConnection, Sendable {
    public let peer: PeerCredentials? = nil
    public let messages: AsyncStream<ReceivedMessage>

    private let fd: CInt
    private let options: ConnectionOptions
    private let sink: AsyncStream<ReceivedMessage>.Continuation
    private let latch = InvalidationLatch()
    /// `true` once the socket is closed; held while a packet is sent.
    private let socketClosed = Mutex(false)
    private let pending = Mutex<(next: UInt64, waiting: [UInt64: CheckedContinuation<[UInt8], any Error>])>((1, [:]))
    private let onEnd: @Sendable (ToyConnection) -> Void

    init(fd: CInt, options: ConnectionOptions, onEnd: @escaping @Sendable (ToyConnection) -> Void = { _ in }) {
        self.fd = fd
        self.options = options
        self.onEnd = onEnd
        (messages, sink) = AsyncStream.makeStream(of: ReceivedMessage.self)
        Thread.detachNewThread { [self] in readLoop() }
    }

    public var invalidationReason: InvalidationReason? { latch.reason }

    public func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        latch.setHandler(handler)
    }

    public func invalidate() {
        // The reader thread wakes at end of stream and finishes the invalidation.
        if latch.invalidate(InvalidationReason(.invalidatedLocally)) { shutdown(fd, CInt(SHUT_RDWR)) }
    }

    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws {
        try send(kind: 1, msgid: msgid, correlation: 0, payload: payload, timeout: timeout)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try checkValid()
        let correlation = pending.withLock { state in
            defer { state.next += 1 }
            return state.next
        }
        return try await withCheckedThrowingContinuation { continuation in
            pending.withLock { $0.waiting[correlation] = continuation }
            // Whichever completes the request first wins; the others find nothing to complete.
            Task {
                try await Task.sleep(for: receiveTimeout)
                complete(correlation, with: .failure(IPCError(code: .receiveTimeout, message: "no reply within \(receiveTimeout)")))
            }
            // Registered before the check, so an invalidation either sees it or is seen here.
            if let reason = latch.reason {
                complete(correlation, with: .failure(IPCError(code: .invalidated, message: "the connection is invalid (\(reason))")))
                return
            }
            do {
                try send(kind: 2, msgid: msgid, correlation: correlation, payload: payload, timeout: sendTimeout)
            } catch {
                complete(correlation, with: .failure(error))
            }
        }
    }

    // MARK: Sending

    private func checkValid() throws {
        if let reason = latch.reason {
            throw IPCError(code: .invalidated, message: "the connection is invalid (\(reason))")
        }
    }

    private func send(kind: UInt8, msgid: UInt32, correlation: UInt64, payload: [UInt8], timeout: Duration) throws {
        try checkValid()
        guard payload.count <= min(options.maximumPayloadLength, ToyTransport.maximumPayloadLength) else {
            throw IPCError(code: .payloadTooLarge, message: "a payload of \(payload.count) bytes is above the maximum")
        }
        var packet = [kind]
        withUnsafeBytes(of: msgid.bigEndian) { packet += $0 }
        withUnsafeBytes(of: correlation.bigEndian) { packet += $0 }
        packet += payload
        try socketClosed.withLock { closed in
            if closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
            try PacketSocket.send(fd, packet, timeout: timeout)
        }
    }

    // MARK: Receiving

    private func complete(_ correlation: UInt64, with result: Result<[UInt8], any Error>) {
        pending.withLock { $0.waiting.removeValue(forKey: correlation) }?.resume(with: result)
    }

    private func readLoop() {
        var reason = InvalidationReason(.peerClosed)
        do {
            while let packet = try PacketSocket.receive(fd, maximumLength: PacketSocket.headerLength + options.maximumPayloadLength) {
                try dispatch(packet)
            }
        } catch let error as IPCError {
            reason = InvalidationReason(error.code == .transportFailure ? .transportFailure : .protocolError, error: error)
        } catch {
            reason = InvalidationReason(.transportFailure)
        }
        _ = latch.invalidate(reason)
        socketClosed.withLock { closed in
            closed = true
            close(fd)
        }
        sink.finish()
        let waiting = pending.withLock { state in
            defer { state.waiting = [:] }
            return state.waiting.values
        }
        let final = latch.reason ?? reason
        for continuation in waiting {
            continuation.resume(throwing: IPCError(code: .peerInvalidated, message: "the connection became invalid: \(final)"))
        }
        onEnd(self)
        latch.complete()
    }

    private func dispatch(_ packet: [UInt8]) throws {
        guard packet.count >= PacketSocket.headerLength else {
            throw IPCError(code: .malformedFrame, message: "a packet of \(packet.count) bytes is shorter than a header")
        }
        let kind = packet[0]
        let msgid = packet[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let correlation = packet[5..<13].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let payload = Array(packet[PacketSocket.headerLength...])
        switch kind {
        case 1:
            sink.yield(ReceivedMessage(msgid: msgid, payload: payload))
        case 2:
            let respond: @Sendable (Frame) throws -> Void = { [weak self] frame in
                guard let self else { throw IPCError(code: .invalidated, message: "the connection is gone") }
                try self.send(kind: frame.kind.rawValue, msgid: frame.msgid, correlation: frame.correlation, payload: frame.payload, timeout: .seconds(5))
            }
            guard let handler = options.requestHandler else {
                sink.yield(ReceivedMessage(msgid: msgid, payload: payload, correlation: correlation, responder: respond))
                return
            }
            var answer = Frame(kind: .reply, msgid: msgid, correlation: correlation)
            do {
                answer.payload = try handler(msgid, payload) ?? []
            } catch {
                answer.kind = .failure
                answer.payload = Array("\(error)".utf8)
            }
            // A reply that cannot be sent is the requester's timeout to report.
            try? respond(answer)
        case 3:
            complete(correlation, with: .success(payload))
        case 4:
            let description = String(decoding: payload, as: UTF8.self)
            complete(correlation, with: .failure(IPCError(code: .transportFailure, message: "the peer's handler failed: \(description)")))
        default:
            throw IPCError(code: .malformedFrame, message: "unknown packet kind \(kind)")
        }
    }
}
