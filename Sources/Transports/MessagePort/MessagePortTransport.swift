import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// Named request/reply ports in the spirit of `CFMessagePort`, on POSIX message queues.
///
/// - A local port (``listen(at:options:acceptFilter:)``) registers a queue under a name that must
///   begin with the group identifier and a period; a remote port (``connect(to:options:)``) looks
///   the name up and fails at once with ``IPCError/Code/endpointNotFound`` if nobody serves it.
/// - Each client has its own reply queue, as a Mach client has a reply port.
/// - Messages larger than the queue's message size (8 KiB by default) are fragmented and
///   reassembled.
/// - Queues give no signal when a process dies, so each side watches the other's process.
///
/// Error codes map to CFMessagePort's: `sendTimeout` (kCFMessagePortSendTimeout),
/// `receiveTimeout` (kCFMessagePortReceiveTimeout), `invalidated` (kCFMessagePortIsInvalid),
/// `peerInvalidated` (kCFMessagePortBecameInvalidError), `payloadTooLarge`/`transportFailure`
/// (kCFMessagePortTransportError).
public struct MessagePortTransport: MessageTransport {
    public typealias Connection = MessagePortConnection
    public typealias Listener = MessagePortListener

    /// Depth and message size of the queues this transport creates. The defaults are the
    /// kernel's limits for unprivileged processes; larger values need `CAP_SYS_RESOURCE`.
    public var queueLimits: (maximumMessages: Int, messageSize: Int)
    /// How long a connect waits for the server's welcome.
    public var connectTimeout: Duration

    public init(queueLimits: (maximumMessages: Int, messageSize: Int) = MessageQueue.systemLimits, connectTimeout: Duration = .seconds(5)) {
        self.queueLimits = queueLimits
        self.connectTimeout = connectTimeout
    }

    public var name: String { "message-port" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            // A hello's pid is checked against the kernel's records (the process holds the
            // reply queue it names open); its uid and gid are the kernel's (/proc/<pid>/status).
            supportsAcceptFilter: true,
            peerDeathDetection: .processWatch,
            supportsSpinning: true
        )
    }

    /// - Throws: ``IPCError/Code/nameOutsideGroup`` for a name outside the group; and what
    ///   ``MessageTransport/listen(at:options:acceptFilter:)`` documents. The accept filter sees
    ///   each client's pid (checked: that process holds open the reply queue its hello names) and
    ///   the uid and gid the kernel records for it; a refused client's connect fails with
    ///   ``IPCError/Code/accessDenied``.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> MessagePortListener {
        try MessagePortListener(endpoint: endpoint, options: options, queueLimits: queueLimits, acceptFilter: acceptFilter)
    }

    /// - Throws: ``IPCError/Code/nameOutsideGroup``; ``IPCError/Code/endpointNotFound`` if no live
    ///   process serves the name; ``IPCError/Code/transportFailure``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> MessagePortConnection {
        try Self.checkScoped(endpoint)
        try GroupDirectories.verify(endpoint.group)
        let loop = try EventLoop.shared()
        guard let serverPID = EndpointLock.owner(of: endpoint), ProcessWatcher.isAlive(pid: serverPID) else {
            throw IPCError(code: .endpointNotFound, message: "no live process serves the message port \(endpoint.name)")
        }
        let server = try MessageQueue.open(name: PortNames.serverQueue(endpoint), forWriting: true)
        let replyName = PortNames.replyQueue(endpoint, pid: getpid(), serial: Self.nextSerial())
        let replyQueue: MessageQueue
        do {
            replyQueue = try MessageQueue.create(name: replyName, maximumMessages: queueLimits.maximumMessages, messageSize: queueLimits.messageSize)
        } catch {
            server.close()
            throw error
        }
        let messageSize = min(queueLimits.messageSize, (try? server.messageSize()) ?? queueLimits.messageSize)
        let clientID: UInt32
        do {
            clientID = try handshake(server: server, replyQueue: replyQueue, messageSize: messageSize, serverPID: serverPID)
        } catch {
            server.close()
            replyQueue.close()
            MessageQueue.unlink(name: replyName)
            throw error
        }
        // The server holds the reply queue open now: its name was only the rendezvous, and a
        // name outlives a process killed later, so give it up at once (nothing left to leak).
        MessageQueue.unlink(name: replyName)
        let connection = MessagePortConnection(
            peer: PeerCredentials(pid: serverPID, uid: getuid(), gid: getgid()),
            outbound: server,
            messageSize: messageSize,
            senderID: clientID,
            role: .client(replyQueue: replyQueue, endpoint: endpoint, serverPID: serverPID),
            options: options,
            loop: loop
        )
        do {
            try connection.startReading(replyQueue)
            try connection.watchPeer(pid: serverPID)
        } catch {
            connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            throw error
        }
        return connection
    }

    /// Sends hello (our pid and reply queue name) and waits for the welcome that assigns our id.
    private func handshake(server: MessageQueue, replyQueue: MessageQueue, messageSize: Int, serverPID: Int32) throws -> UInt32 {
        var hello = withUnsafeBytes(of: UInt32(bitPattern: getpid()).bigEndian, Array.init)
        hello += Array(replyQueue.name.utf8)
        let writer = FragmentWriter(queue: server, messageSize: messageSize)
        try writer.sendControl(PortFragmentHeader(kind: .hello), payload: hello, deadline: MessageQueue.realtimeDeadline(after: connectTimeout))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: try replyQueue.messageSize(), alignment: 8)
        defer { buffer.deallocate() }
        // Wait in slices, so that a server that dies during the handshake is noticed at once.
        let deadline = ContinuousClock.now + connectTimeout
        while ContinuousClock.now < deadline, ProcessWatcher.isAlive(pid: serverPID) {
            guard let count = try replyQueue.receive(into: buffer, deadline: MessageQueue.realtimeDeadline(after: .milliseconds(50))) else { continue }
            guard let answer = try? PortFragmentHeader(parsing: UnsafeRawBufferPointer(rebasing: buffer[..<count])) else { break }
            if answer.kind == .refused {
                throw IPCError(code: .accessDenied, message: "the message port's accept filter refused this process (pid \(getpid()))")
            }
            guard answer.kind == .welcome else { break }
            return answer.sender
        }
        throw IPCError(code: .endpointNotFound, message: "the message port's server did not answer (it died, or took longer than \(connectTimeout))")
    }

    static func checkScoped(_ endpoint: Endpoint) throws {
        guard endpoint.isScopedToGroup else {
            throw IPCError(
                code: .nameOutsideGroup,
                message: "message port name \(endpoint.name.debugDescription) must begin with the group identifier \(endpoint.group.identifier.debugDescription) and a period"
            )
        }
    }

    private static let serial = Atomic<Int>(0)

    private static func nextSerial() -> Int {
        serial.add(1, ordering: .relaxed).newValue
    }
}

extension MessageTransport where Self == MessagePortTransport {
    /// Named ports on POSIX message queues.
    public static var messagePort: MessagePortTransport { MessagePortTransport() }
}
