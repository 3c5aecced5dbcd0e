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
public final class UnixSocketConnection: FrameConnection, Sendable {
    public let peer: PeerCredentials?

    private let fd: CInt
    private let framing: Framing
    private let encoder: any FrameEncoder
    public let core: ConnectionCore
    /// Held for the whole of each frame's write; `true` once the descriptor is closed.
    private let writeState = Mutex(false)
    /// How long the reader thread waits to write a reply before giving up on it.
    private let replySendTimeout: Duration = .seconds(5)
    private let onInvalidated: (@Sendable (UnixSocketConnection) -> Void)?

    init(fd: CInt, peer: PeerCredentials?, framing: Framing, options: ConnectionOptions, onInvalidated: (@Sendable (UnixSocketConnection) -> Void)? = nil) {
        self.fd = fd
        self.peer = peer
        self.framing = framing
        self.core = ConnectionCore(options: options)
        self.encoder = framing.makeEncoder(maximumPayloadLength: options.maximumPayloadLength)
        self.onInvalidated = onInvalidated
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
        // Wake the reader thread; it releases everything and reports the invalidation.
        UnixSocket.shutdown(fd)
    }

    public func sendFrame(_ frame: Frame, timeout: Duration) throws {
        try core.checkValid()
        var headerBytes: [UInt8] = []
        headerBytes.reserveCapacity(framing == .binary ? BinaryWireFormat.headerLength : 160)
        try encoder.encodeHeader(FrameHeader(frame), into: &headerBytes)
        let deadline = ContinuousClock.now.advanced(by: timeout)
        var written = 0
        do {
            try writeState.withLock { closed in
                if closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
                try headerBytes.withUnsafeBytes { headerBuffer in
                    try frame.payload.withUnsafeBytes { payloadBuffer in
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
        let reassembler = framing.makeReassembler(maximumPayloadLength: core.options.maximumPayloadLength)
        let reply = replySender(timeout: replySendTimeout)
        var reason: InvalidationReason
        let stallTimeout = core.options.stalledFrameTimeout
        if let stallTimeout {
            do {
                try UnixSocket.setReceiveTimeout(fd, stallTimeout)
            } catch {
                finish(InvalidationReason(.transportFailure, error: error as? IPCError))
                return
            }
        }
        reading: while true {
            let count: Int
            do {
                let buffered = reassembler.bufferedByteCount
                count = try reassembler.receive { buffer in
                    while true {
                        if let count = try UnixSocket.read(fd, into: buffer, timingOut: stallTimeout != nil) { return count }
                        // The receive timeout passed: fine between frames, a stall inside one.
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
            do {
                while let frame = try reassembler.nextFrame() {
                    core.dispatch(frame, reply: reply)
                }
            } catch {
                reason = InvalidationReason(.protocolError, error: error as? IPCError)
                break reading
            }
        }
        finish(reason)
    }

    /// Runs once, on the reader thread (or in `start` if it never ran).
    private func finish(_ reason: InvalidationReason) {
        core.finish(reason) {
            writeState.withLock { closed in
                closed = true
                closeDescriptor(fd)
            }
            onInvalidated?(self)
        }
    }
}
