import IPCCore
import IPCFraming
import IPCPosix
import Synchronization

/// One `AF_UNIX` stream connection, on either side.
///
/// Sends write the frame on the calling thread (one gathering write of header and payload, under
/// a lock so concurrent senders never interleave frames). A dedicated thread blocks in `read`
/// (after polling with non-blocking reads for a while under a spinning ``WaitStrategy``),
/// reassembles frames and dispatches them: replies complete their requests, requests go to the
/// request handler (whose reply is written from that thread), and messages go to ``messages``.
/// That thread is also the only one that closes the descriptor, so no read ever lands on a
/// descriptor number that was closed and reused.
///
/// Requests made back to back read their own replies on the requesting thread while the reader
/// thread parks (``ReceiveOwnership``): a round trip then costs what a plain blocking client's
/// does, without handing each reply from one thread to another.
public final class UnixSocketConnection: FrameConnection, Sendable {
    public let peer: PeerCredentials?

    private let fd: CInt
    private let framing: Framing
    private let encoder: any FrameEncoder
    public let core: ConnectionCore
    /// Held for the whole of each frame's write: whether the descriptor is closed, and the
    /// socket's `SO_SNDTIMEO` as last set (see ``UnixSocket/sendAll(_:header:payload:timeout:deadline:socketTimeout:written:)``).
    private let writeState = Mutex<(closed: Bool, socketTimeout: Duration?)>((false, nil))
    /// How long the reader thread waits to write a reply before giving up on it.
    private let replySendTimeout: Duration = .seconds(5)
    private let onInvalidated: (@Sendable (UnixSocketConnection) -> Void)?
    /// What only the thread that currently reads may touch.
    private let reading: ReadingState

    /// The reassembler and the socket's receive timeout. Used by one thread at a time: the
    /// reader thread, or a requester reading directly, as ``ReceiveOwnership`` decides; its lock
    /// orders every hand-over.
    private final class ReadingState: @unchecked Sendable {
        let reassembler: any FrameReassembling
        /// `SO_RCVTIMEO` as last set; zero is none.
        var receiveTimeout: Duration = .zero

        init(_ reassembler: any FrameReassembling) {
            self.reassembler = reassembler
        }
    }

    init(fd: CInt, peer: PeerCredentials?, framing: Framing, options: ConnectionOptions, onInvalidated: (@Sendable (UnixSocketConnection) -> Void)? = nil) {
        self.fd = fd
        self.peer = peer
        self.framing = framing
        self.core = ConnectionCore(options: options)
        self.encoder = framing.makeEncoder(maximumPayloadLength: options.maximumPayloadLength)
        self.onInvalidated = onInvalidated
        self.reading = ReadingState(framing.makeReassembler(maximumPayloadLength: options.maximumPayloadLength))
    }

    /// Starts the reader thread. If it cannot start, the connection is closed and the error thrown.
    func start() throws {
        do {
            try PosixThread.detach(name: "ipc-unix-read") { [self] in readLoop() }
        } catch {
            finish(InvalidationReason(.transportFailure, error: error as? IPCError))
            throw error
        }
    }

    public func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        // Wake the reader thread, parked or reading; it releases everything and reports the
        // invalidation. A requester reading directly meets the end of the stream and hands back.
        core.ownership.stop()
        UnixSocket.shutdown(fd)
    }

    public func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        try await core.request(payload, msgid: msgid, receiveTimeout: receiveTimeout) {
            try sendFrame($0, timeout: sendTimeout)
        } readDirectly: { correlation, deadline in
            self.readDirectly(until: correlation, deadline: deadline, timeout: receiveTimeout)
        }
    }

    /// A requester's direct read (see ``ReceiveOwnership``): reads and dispatches until request
    /// `correlation` is finished. Anything else (the deadline, the end of the stream, an error)
    /// hands reading back to the reader thread, which acts on it as it always does.
    private func readDirectly(until correlation: UInt64, deadline: UInt64, timeout: Duration) {
        var failed = true
        defer { core.endDirectRead(for: correlation, failed: failed) }
        let reassembler = reading.reassembler
        let reply = cachedReplySender(timeout: replySendTimeout)
        let strategy = core.options.waitStrategy
        while !core.requests.isFinished(correlation) {
            let count: Int
            do {
                count = try reassembler.receive { buffer in
                    if let count = try SpinWait.poll(strategy, { try UnixSocket.readIfReady(fd, into: buffer) }) { return count }
                    if reading.receiveTimeout != timeout {
                        try UnixSocket.setReceiveTimeout(fd, timeout)
                        reading.receiveTimeout = timeout
                    }
                    while true {
                        if let count = try UnixSocket.readWaiting(fd, into: buffer) { return count }
                        if monotonicNanoseconds() >= deadline { throw IPCError(code: .receiveTimeout, message: "no reply in time") }
                    }
                }
            } catch {
                return
            }
            if count == 0 { return }
            do {
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
        let deadline = ContinuousClock.now.advanced(by: timeout)
        var written = 0
        do {
            try encoder.withEncodedHeader(FrameHeader(frame)) { headerBuffer in
                try writeState.withLock { state in
                    if state.closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
                    try frame.payload.withUnsafeBytes { payloadBuffer in
                        try UnixSocket.sendAll(
                            fd, header: headerBuffer, payload: payloadBuffer, timeout: timeout, deadline: deadline,
                            socketTimeout: &state.socketTimeout, written: &written
                        )
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
        let reassembler = reading.reassembler
        let reply = cachedReplySender(timeout: replySendTimeout)
        let strategy = core.options.waitStrategy
        var reason: InvalidationReason
        let stallTimeout = core.options.stalledFrameTimeout
        reading: while true {
            // Dispatch what is buffered first: a requester that read directly may have stopped
            // with whole frames left (when the message buffer filled).
            do {
                try core.dispatchAll(reassembler.nextFrame, reply: reply)
            } catch {
                reason = InvalidationReason(.protocolError, error: error as? IPCError)
                break reading
            }
            // Requests are following one another: let them read their own replies for a while.
            core.parkReceiveThreadIfRequested()
            let count: Int
            do {
                let buffered = reassembler.bufferedByteCount
                count = try reassembler.receive { buffer in
                    if let count = try SpinWait.poll(strategy, { try UnixSocket.readIfReady(fd, into: buffer) }) { return count }
                    // The receive timeout bounds a stall inside a frame; a direct read may have
                    // set another one, so it is set again when it differs.
                    let timeout = stallTimeout ?? .zero
                    if reading.receiveTimeout != timeout {
                        try UnixSocket.setReceiveTimeout(fd, timeout)
                        reading.receiveTimeout = timeout
                    }
                    while true {
                        if let count = try UnixSocket.readWaiting(fd, into: buffer) { return count }
                        // The receive timeout, set to the stall timeout just above, passed with
                        // nothing read: fine between frames, a stall inside one.
                        if buffered > 0, let stallTimeout {
                            throw IPCError(code: .truncatedFrame, message: "the peer sent \(buffered) bytes of a frame and then nothing for \(stallTimeout)")
                        }
                    }
                }
            } catch let error as IPCError where error.code == .truncatedFrame {
                reason = InvalidationReason(.protocolError, error: error)
                break reading
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
        }
        finish(reason)
    }

    /// Runs once, on the reader thread (or in `start` if it never ran).
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            writeState.withLock { state in
                state.closed = true
                closeDescriptor(fd)
            }
            onInvalidated?(self)
        }
    }
}
