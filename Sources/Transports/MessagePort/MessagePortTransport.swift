import Glibc
public import IPCCore
public import IPCEngine
public import IPCSystem
import Synchronization
import SystemPackage

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
            supportsSpinning: true,
            supportsConnectionLimit: true
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
    ///   process serves the name, or (made with ``IPCError/listenerBusy(_:answered:)``) if the
    ///   server is full, or runs but did not answer within ``connectTimeout`` (its queue full
    ///   included); ``IPCError/Code/transportFailure``.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> MessagePortConnection {
        let opening = try open(endpoint)
        return try opening.finish(options, clientID: opening.handshake { try handshake(opening) })
    }

    /// The `async` connect: the hello waits for room in the server's queue, and the welcome for
    /// the reply queue to be readable, on the event loop, suspended; the task holds no thread.
    /// - Throws: as the synchronous connect; `CancellationError`.
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) async throws -> MessagePortConnection {
        try Task.checkCancellation()
        let opening = try open(endpoint)
        let clientID: UInt32
        do {
            clientID = try await handshakeSuspending(opening)
        } catch {
            opening.abandon()
            throw error
        }
        return try opening.finish(options, clientID: clientID)
    }

    /// A connect under way: the server's queue open, this client's reply queue made.
    private struct Opening {
        let endpoint: Endpoint
        let loop: EventLoop
        let serverPID: Int32
        let server: MessageQueue
        let replyQueue: MessageQueue
        let messageSize: Int

        /// The hello: this process's pid and the reply queue's name.
        var hello: [UInt8] {
            withUnsafeBytes(of: UInt32(bitPattern: getpid()).bigEndian, Array.init) + Array(replyQueue.name.utf8)
        }

        /// Runs the handshake; on failure, releases both queues.
        func handshake(_ body: () throws -> UInt32) throws -> UInt32 {
            do {
                return try body()
            } catch {
                abandon()
                throw error
            }
        }

        func abandon() {
            server.close()
            replyQueue.close()
            MessageQueue.unlink(name: replyQueue.name)
        }

        /// The handshake succeeded: the connection, reading its reply queue on the loop.
        func finish(_ options: ConnectionOptions, clientID: UInt32) throws -> MessagePortConnection {
            // The server holds the reply queue open now: its name was only the rendezvous, and a
            // name outlives a process killed later, so give it up at once (nothing left to leak).
            MessageQueue.unlink(name: replyQueue.name)
            let channel: MessagePortChannel
            do {
                channel = try MessagePortChannel(
                    role: .client(replyQueue: replyQueue, endpoint: endpoint, serverPID: serverPID),
                    outbound: server, messageSize: messageSize, senderID: clientID, maximumPayloadLength: options.maximumPayloadLength
                )
            } catch {
                abandon()
                throw error
            }
            let connection = try EngineConnection(
                channel: channel,
                peer: PeerCredentials(pid: serverPID, uid: getuid(), gid: getgid()),
                options: options,
                loop: loop,
                label: "a message-port client of \(endpoint.name)"
            )
            do {
                try connection.watchPeerProcess(serverPID)
            } catch {
                connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
                throw error
            }
            return connection
        }
    }

    /// Opens the server's queue and makes this client's reply queue.
    private func open(_ endpoint: Endpoint) throws -> Opening {
        try Self.checkScoped(endpoint)
        try GroupDirectories.verify(endpoint.group)
        let loop = try EventLoop.shared()
        guard let serverPID = EndpointLock.owner(of: endpoint), ProcessWatcher.isAlive(pid: serverPID) else {
            throw IPCError(code: .endpointNotFound, message: "no live process serves the message port \(endpoint.name)")
        }
        let server = try MessageQueue.open(name: PortNames.serverQueue(endpoint), forWriting: true)
        let replyQueue: MessageQueue
        do {
            replyQueue = try makeReplyQueue(endpoint)
        } catch {
            server.close()
            throw error
        }
        let messageSize: Int
        do {
            // The name leads to whatever queue is there: another process of the user may have
            // put one of its own, of any size, in the moment before the listener takes the name
            // back (it does within a second).
            messageSize = min(queueLimits.messageSize, try server.messageSize())
            try PortFragmentHeader.checkQueueMessageSize(messageSize, of: "the queue named for the message port \(endpoint.name)")
            try PortFragmentHeader.checkQueueMessageSize(try replyQueue.messageSize(), of: "this client's reply queue")
        } catch {
            server.close()
            replyQueue.close()
            MessageQueue.unlink(name: replyQueue.name)
            throw error
        }
        return Opening(endpoint: endpoint, loop: loop, serverPID: serverPID, server: server, replyQueue: replyQueue, messageSize: messageSize)
    }

    /// Sends hello (our pid and reply queue name) and waits for the welcome that assigns our id.
    private func handshake(_ opening: Opening) throws -> UInt32 {
        // One deadline for the hello's room and the answer, as the suspending handshake has.
        let deadline = ContinuousClock.now + connectTimeout
        let writer = FragmentWriter(queue: opening.server, messageSize: opening.messageSize)
        do {
            try writer.sendControl(PortFragmentHeader(kind: .hello), payload: opening.hello, deadline: .after(connectTimeout))
        } catch let error as IPCError where error.code == .sendTimeout {
            // The port's queue stayed full: a server that reads nothing, or a flood.
            throw serverDidNotAnswer(opening, queueFull: true)
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: try opening.replyQueue.messageSize(), alignment: 8)
        defer { buffer.deallocate() }
        // Wait in slices, so that a server that dies during the handshake is noticed at once.
        while ContinuousClock.now < deadline, ProcessWatcher.isAlive(pid: opening.serverPID) {
            guard let count = try opening.replyQueue.receive(into: buffer, deadline: .after(.milliseconds(50))) else { continue }
            return try welcome(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
        throw serverDidNotAnswer(opening)
    }

    /// ``handshake(_:)``, suspended on the loop while the server's queue is full and while the
    /// welcome has not come (in slices of 50 ms, so that a server that dies meanwhile is noticed).
    private func handshakeSuspending(_ opening: Opening) async throws -> UInt32 {
        let deadline = monotonicNanoseconds() &+ connectTimeout.wholeNanoseconds
        var sent = 0
        while try !FragmentWriter(queue: opening.server, messageSize: opening.messageSize).sendAvailable(PortFragmentHeader(kind: .hello), opening.hello, sent: &sent) {
            switch try await opening.loop.waitUntil(opening.server.descriptor.rawValue, is: .writable, deadline: deadline) {
            case .ready: continue
            case .deadlinePassed: throw serverDidNotAnswer(opening, queueFull: true)
            case .cancelled: throw CancellationError()
            }
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: try opening.replyQueue.messageSize(), alignment: 8)
        defer { buffer.deallocate() }
        while monotonicNanoseconds() < deadline, ProcessWatcher.isAlive(pid: opening.serverPID) {
            if let count = try opening.replyQueue.receiveIfReady(into: buffer) {
                return try welcome(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
            }
            let slice = min(deadline, monotonicNanoseconds() &+ Duration.milliseconds(50).wholeNanoseconds)
            if try await opening.loop.waitUntil(opening.replyQueue.descriptor.rawValue, is: .readable, deadline: slice) == .cancelled {
                throw CancellationError()
            }
        }
        throw serverDidNotAnswer(opening)
    }

    /// The server's answer to a hello: this client's id, or why there is none.
    private func welcome(_ message: UnsafeRawBufferPointer) throws -> UInt32 {
        guard let answer = try? PortFragmentHeader(parsing: message) else { throw answeredOtherwise() }
        if answer.kind == .refused {
            switch PortRefusal(rawValue: answer.msgid) {
            case .tooManyConnectionsFromProcess:
                throw IPCError(
                    code: .transportFailure,
                    message: "the message port refused this connection: this process (pid \(getpid())) already has \(MessagePortListener.maximumClientsPerProcess) connections to it, the most one process may hold"
                )
            case .listenerFull:
                throw IPCError.listenerBusy("the message port is full: its listener has as many connections as it keeps (maximumConnections); try again later")
            case .acceptFilter, nil:
                break
            }
            throw IPCError(code: .accessDenied, message: "the message port's accept filter refused this process (pid \(getpid()))")
        }
        guard answer.kind == .welcome else { throw answeredOtherwise() }
        return answer.sender
    }

    /// No welcome or refusal came before the connect timeout (`queueFull`: the hello found no
    /// room in the port's queue in that time). If no live process holds the port now, the
    /// server is gone. If one does, a service runs, and the error is busy without an answer
    /// (``IPCCore/IPCError/ListenerBusy/answered`` `false`): the server flooded with hellos (it
    /// drops those past 256 unchecked), its accept filter slow, its process hung or stopped; or
    /// another server took the port meanwhile. So a ``IPCCore/ServiceConnection`` does not start
    /// another copy, which could not take the port.
    private func serverDidNotAnswer(_ opening: Opening, queueFull: Bool = false) -> IPCError {
        let what = queueFull ? "left no room in its queue for the hello" : "did not answer"
        guard let owner = EndpointLock.owner(of: opening.endpoint) else {
            return IPCError(code: .endpointNotFound, message: "the message port's server (pid \(opening.serverPID)) \(what) within \(connectTimeout), and no process serves the port now")
        }
        let why = owner == opening.serverPID ? "it is flooded with connects, its accept filter is slow, or it is hung or stopped" : "another server (pid \(owner)) serves the port now"
        return IPCError.listenerBusy("the message port's server (pid \(opening.serverPID)) \(what) within \(connectTimeout): \(why); try again later", answered: false)
    }

    private func answeredOtherwise() -> IPCError {
        IPCError(code: .transportFailure, message: "the message port's server answered the hello with something other than a welcome or a refusal")
    }

    static func checkScoped(_ endpoint: Endpoint) throws {
        guard endpoint.isScopedToGroup else {
            throw IPCError(
                code: .nameOutsideGroup,
                message: "message port name \(endpoint.name.debugDescription) must begin with the group identifier \(endpoint.group.identifier.debugDescription) and a period"
            )
        }
    }

    /// Makes this client's reply queue, `<server queue>.r<pid>.<serial>` with a random 63-bit
    /// serial: queue names are one namespace for every user, and a predictable name (the pid
    /// and a counter, before) could be created first by another user, failing the connect. A
    /// name taken anyway (by chance, or by someone creating names at random) is drawn again, up
    /// to 8 times.
    /// - Throws: ``IPCError/Code/transportFailure`` if 8 names were taken; what creating the
    ///   queue throws otherwise (``IPCError/Code/transportFailure`` with `EMFILE` when the
    ///   user's `RLIMIT_MSGQUEUE` is used up).
    private func makeReplyQueue(_ endpoint: Endpoint) throws -> MessageQueue {
        var generator = SystemRandomNumberGenerator()
        var taken: [String] = []
        for _ in 0..<8 {
            let name = PortNames.replyQueue(endpoint, pid: getpid(), serial: Int(truncatingIfNeeded: generator.next() >> 1))
            do {
                return try MessageQueue.create(name: name, maximumMessages: queueLimits.maximumMessages, messageSize: queueLimits.messageSize)
            } catch let error as IPCError where error.code == .endpointInUse || error.code == .accessDenied {
                taken.append(name)
            }
        }
        throw IPCError(code: .transportFailure, message: "8 random reply queue names were all taken (\(taken.joined(separator: ", "))): another process is creating names in this port's namespace")
    }
}

extension MessageTransport where Self == MessagePortTransport {
    /// Named ports on POSIX message queues.
    public static var messagePort: MessagePortTransport { MessagePortTransport() }
}
