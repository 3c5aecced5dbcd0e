import Glibc
import IPCCore
public import IPCEngine
import IPCSystem
import SystemPackage

/// One side of a message port conversation: an ``EngineConnection`` over a
/// ``MessagePortChannel``, as every transport's connection is.
///
/// A client's reply queue is read by the process's event loop (a POSIX message queue is a
/// pollable descriptor on Linux). On the server, the listener reads the port's queue for all
/// clients and delivers each client's fragments to that client's connection. Sends go through
/// the engine (a full queue suspends a task, or waits for the loop's word on a thread), and the
/// other side's death is seen through its process (a pidfd), since a message queue has no
/// connection to break.
public typealias MessagePortConnection = EngineConnection

/// What the engine needs of one message port conversation: fragments in (read from the
/// client's reply queue, or delivered by the listener), fragments out (to the other side's
/// queue), a goodbye and the queues' names tidied at the end.
///
/// A frame's encoding is its fragments, each one queue message: `fragments × 28` header bytes
/// plus the payload; every fragment but the last fills a queue message, so a byte offset the
/// engine hands back to ``write(_:from:)`` always falls on a fragment's start.
final class MessagePortChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: the reading state (`assembler`, `polled`, `current`, `delivered`) is touched on
    // the loop's thread only; `endReason` is set on the loop's thread before the engine's lock
    // that orders it before ``close()``; the rest is immutable.
    //
    // The variables are `@exclusivity(unchecked)`: none is accessed across a call that could
    // reach it again (`deliver`'s `read` runs with no access held), and the runtime's dynamic
    // checks cost about 240 instructions a round trip on each side (callgrind,
    // `Scripts/instructions.sh`), as they did in the unix-socket channel before.

    enum Role {
        /// The client: it reads its own reply queue (unnamed once the server has opened it) and
        /// writes to the server's queue.
        case client(replyQueue: MessageQueue, endpoint: Endpoint, serverPID: Int32)
        /// The server's view of one client: fragments are delivered by the listener, replies go
        /// to the client's reply queue, whose name is removed at the end.
        case server(clientQueueName: String)
    }

    let descriptor: FileDescriptor
    let writeDescriptor: FileDescriptor
    let inbound: ChannelInbound
    let role: Role
    private let writer: FragmentWriter
    /// The id this side puts in the `sender` field: the client's assigned id, or 0 on the server.
    let senderID: UInt32
    @exclusivity(unchecked) private var assembler: FragmentAssembler
    /// A client's receive buffer, one queue message long.
    private let readBuffer: UnsafeMutableRawBufferPointer?
    @exclusivity(unchecked) private var polled = PolledRead()
    /// A fragment the listener hands over (``deliver(_:_:read:)``), for ``readAvailable()``.
    @exclusivity(unchecked) private var delivered: (header: PortFragmentHeader, body: UnsafeRawBufferPointer)?
    /// The fragment read and not yet taken by ``nextFrame()``: in ``readBuffer``, or in the
    /// listener's buffer during a delivery.
    @exclusivity(unchecked) private var current: (header: PortFragmentHeader, body: UnsafeRawBufferPointer)?
    @exclusivity(unchecked) private var endReason: InvalidationReason?

    /// - Parameters:
    ///   - outbound: the queue this side writes to (owned: closed by ``close()``).
    ///   - messageSize: the size of the fragments written (at most the outbound queue's).
    init(role: Role, outbound: MessageQueue, messageSize: Int, senderID: UInt32, maximumPayloadLength: Int) throws {
        self.role = role
        self.writer = FragmentWriter(queue: outbound, messageSize: messageSize)
        self.senderID = senderID
        self.assembler = FragmentAssembler(maximumPayloadLength: maximumPayloadLength)
        writeDescriptor = outbound.descriptor
        switch role {
        case .client(let replyQueue, _, _):
            descriptor = replyQueue.descriptor
            inbound = .descriptor
            readBuffer = .allocate(byteCount: try replyQueue.messageSize(), alignment: 8)
        case .server:
            // Nothing to read here: the descriptor is the one written to.
            descriptor = writeDescriptor
            inbound = .delivered
            readBuffer = nil
        }
    }

    deinit {
        readBuffer?.deallocate()
    }

    /// On the client's side, the name its reply queue had until the server opened it.
    var replyQueueName: String? {
        if case .client(let replyQueue, _, _) = role { return replyQueue.name }
        return nil
    }

    /// On the server's side, the client's reply queue.
    var clientQueueName: String? {
        if case .server(let name) = role { return name }
        return nil
    }

    /// The listener hands over one fragment of this client's (loop thread): `read` (the
    /// connection's ``EngineConnection/readNow()``) reads it while `body` is valid.
    func deliver(_ header: PortFragmentHeader, _ body: UnsafeRawBufferPointer, read: () -> Void) {
        delivered = (header, body)
        read()
        delivered = nil
        current = nil
    }

    // MARK: Reading (loop thread)

    func readAvailable() throws -> Int? {
        let fragment: (header: PortFragmentHeader, body: UnsafeRawBufferPointer)
        switch role {
        case .client(let replyQueue, _, _):
            guard let readBuffer, let count = try polled.take({ try replyQueue.receiveIfReady(into: readBuffer) }) else { return nil }
            let bytes = UnsafeRawBufferPointer(rebasing: readBuffer[..<count])
            fragment = (try PortFragmentHeader(parsing: bytes), UnsafeRawBufferPointer(rebasing: bytes[PortFragmentHeader.length...]))
        case .server:
            guard let handed = delivered else { return nil }
            delivered = nil
            fragment = handed
        }
        switch fragment.header.kind {
        case .goodbye:
            return 0
        case .hello, .welcome, .wake, .refused:
            // Nothing for a connection (a listener's or a connect's business): read past it.
            return nil
        case .message, .request, .reply, .failure:
            current = fragment
            return PortFragmentHeader.length + fragment.body.count
        }
    }

    func nextFrame() throws -> Frame? {
        guard let (header, body) = current else { return nil }
        current = nil
        return try assembler.add(header, body)
    }

    /// A one-way message in one fragment is lent from the queue message it arrived in: no copy
    /// and no allocation if the handler takes it.
    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        guard let (header, body) = current else { return nil }
        current = nil
        if header.kind == .message, assembler.isWholeMessage(header, byteCount: body.count) {
            if lend(FrameHeader(kind: .message, msgid: header.msgid, correlation: header.correlation, payloadLength: body.count), body) { return .lent }
            return .owned(Frame(kind: .message, msgid: header.msgid, correlation: header.correlation, payload: Array(body)))
        }
        guard let frame = try assembler.add(header, body) else { return nil }
        // A message in several fragments is lent from the array it was assembled in.
        guard frame.kind == .message else { return .owned(frame) }
        return frame.payload.withUnsafeBytes { lend(FrameHeader(frame), $0) } ? .lent : .owned(frame)
    }

    var hasPartialFrame: Bool { assembler.isAssembling }

    func finishReading() throws {
        if assembler.isAssembling {
            throw IPCError(code: .truncatedFrame, message: "the peer said goodbye in the middle of a fragmented message")
        }
    }

    func startPollingWhileSpinning() -> Bool { readBuffer != nil }

    func pollWhileSpinning() -> Bool {
        guard case .client(let replyQueue, _, _) = role, let readBuffer else { return false }
        return polled.poll { try replyQueue.receiveIfReady(into: readBuffer) }
    }

    // MARK: Writing (one writer at a time)

    func encodedLength(of frame: Frame) throws -> Int {
        guard frame.payload.count <= Int(UInt32.max) else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above what a fragment header can announce")
        }
        return frame.payload.count + fragmentCount(frame.payload.count) * PortFragmentHeader.length
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        var sent = offset / writer.messageSize
        let header = PortFragmentHeader(kind: PortMessageKind(frame.kind)!, msgid: frame.msgid, correlation: frame.correlation, sender: senderID)
        let done = try writer.sendAvailable(header, frame.payload, sent: &sent)
        let end = done ? try encodedLength(of: frame) : sent * writer.messageSize
        return end - offset
    }

    private func fragmentCount(_ payloadLength: Int) -> Int {
        // At least 1: the writers' sizes are checked (``PortFragmentHeader/minimumQueueMessageSize``).
        let chunk = max(1, writer.messageSize - PortFragmentHeader.length)
        return max(1, (payloadLength + chunk - 1) / chunk)
    }

    // MARK: Ending

    func shutdown() {
        // A message queue has no way to wake a waiter; nobody waits on one here (the engine's
        // senders wait for the loop's word, which the invalidation gives).
    }

    func ending(_ reason: InvalidationReason) {
        endReason = reason
    }

    func close() {
        // Whatever ended this side, unless the other side did (it died; or, on a client, the
        // server said goodbye), tell it: a peer whose connection was ended here for a protocol
        // error or a failure would otherwise wait for replies that never come. A server answers
        // a client's goodbye with its own, since anyone of the user can write one into the
        // port's queue in a client's name: a client whose connection a forged goodbye ended
        // learns so, rather than waiting on a connection the server dropped. Without waiting: a
        // peer that does not read will not read this either.
        let peerEnded: Bool
        switch (role, endReason?.kind) {
        case (_, .peerDied?), (.client, .peerClosed?): peerEnded = true
        default: peerEnded = false
        }
        if !peerEnded {
            try? writer.sendControl(PortFragmentHeader(kind: .goodbye, sender: senderID), deadline: .after(.zero))
        }
        writer.queue.close()
        switch role {
        case .client(let replyQueue, let endpoint, let serverPID):
            replyQueue.close()
            // Whatever ended this side (the watch may not have fired yet when the application
            // closes first), a dead server cannot remove its queue: remove it unless a successor
            // holds the name.
            if endReason?.kind == .peerDied || !ProcessWatcher.isAlive(pid: serverPID) {
                EndpointLock.ifUnheld(endpoint) { MessageQueue.unlink(name: PortNames.serverQueue(endpoint)) }
            }
        case .server(let clientQueueName):
            // The client gives its reply queue's name up once it reads the welcome; one killed
            // before that cannot. The name is only a rendezvous, so removing it is harmless
            // either way (an open queue stays usable).
            MessageQueue.unlink(name: clientQueueName)
        }
    }
}

extension EngineConnection {
    /// A message-port client's reply queue name (until the server opened it); `nil` for other
    /// connections.
    var replyQueueName: String? { (channel as? MessagePortChannel)?.replyQueueName }

    /// A message-port client's id, which its fragments carry (0 on the server's side); `nil` for
    /// other connections.
    var messagePortSenderID: UInt32? { (channel as? MessagePortChannel)?.senderID }
}
