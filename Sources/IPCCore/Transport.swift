/// The credentials of the process on the other end, as the kernel reports them (never as the
/// peer claims them in a payload).
public struct PeerCredentials: Sendable, Hashable, Codable, CustomStringConvertible {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32

    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    public var description: String { "pid \(pid) uid \(uid) gid \(gid)" }
}

/// Answers a request: the way to serve. Returning `nil` sends an empty successful reply;
/// throwing sends a `.failure` frame whose payload describes the error, which the requester
/// receives as ``IPCError/Code/transportFailure``.
///
/// The handler runs as a task, off the transport's receive path (see
/// ``ConnectionOptions/requestHandlerExecutor``): it may suspend, wait and take as long as it
/// needs, and holds up only its own connection (XPC's connection queue). One connection's
/// requests are handled one at a time, in arrival order, unless
/// ``ConnectionOptions/maximumConcurrentRequests`` allows more; different connections are always
/// handled independently. When the connection ends, the tasks of its running handlers are
/// cancelled and their replies are not sent.
public typealias RequestHandler = @Sendable (_ msgid: UInt32, _ payload: [UInt8]) async throws -> [UInt8]?

/// The fast path: answers a request synchronously **on the receive path** (the event loop's
/// thread, which serves every connection of the process) before the next message is read.
/// Runs on the loop: must not block. A handler that waits, sleeps or takes a lock another
/// thread holds stalls every connection of the process, and the loop's stall detector says so.
/// Use ``RequestHandler`` unless the reply is computed at once from the request.
public typealias OnLoopRequestHandler = @Sendable (_ msgid: UInt32, _ payload: [UInt8]) throws -> [UInt8]?

/// Takes a one-way message on the receive path, in arrival order, before it would reach
/// ``MessageConnection/messages``. Returns `true` if it consumed the message, `false` to let it
/// through to ``MessageConnection/messages``. `send` sends a one-way message back on the same
/// connection (from the receive path: keep it short, as for a ``RequestHandler``).
///
/// Runs on the loop: must not block (it holds up every connection of the process). Messages
/// consumed here skip the hand-over to the task reading ``MessageConnection/messages``,
/// which costs a wake-up per message; the order between consumed messages and those let
/// through is the order in which each path sees them, not one order across both.
public typealias MessageHandler = @Sendable (_ message: ReceivedMessage, _ send: (_ payload: [UInt8], _ msgid: UInt32) throws -> Void) -> Bool

/// Takes a one-way message's payload where the receive path read it, before any
/// ``MessageHandler``: no copy, no allocation. Runs on the loop: must not block. `payload` is borrowed for the call only (a
/// `RawSpan` cannot outlive it); copy what must be kept. Returns `true` if it consumed the
/// message, `false` to let it through, as a `[UInt8]` of its own, to the ``MessageHandler`` and
/// then to ``MessageConnection/messages``. `send` as for a ``MessageHandler``. Runs on the receive
/// path, in arrival order: keep it short.
///
/// Which transports lend in place is in `docs/ENGINE.md`; on the others the handler is given the
/// payload of the array the transport made (the same call, one allocation per message).
public typealias BorrowingMessageHandler = @Sendable (_ msgid: UInt32, _ payload: RawSpan, _ send: (_ payload: [UInt8], _ msgid: UInt32) throws -> Void) -> Bool

/// Decides whether a connecting peer is accepted, from its kernel-verified credentials.
///
/// Runs off the listener's event loop, one connecting client at a time per listener, so it may
/// take its time (a policy lookup, a log write): it holds up only the clients connecting to
/// that listener after it, never a connection already made. At most 256 clients of a listener
/// wait for it; the next are turned away (a rendezvous answers busy).
public typealias AcceptFilter = @Sendable (PeerCredentials) -> Bool

/// A one-way message or request delivered through ``MessageConnection/messages``.
public struct ReceivedMessage: Sendable {
    public var msgid: UInt32
    public var payload: [UInt8]
    private let responder: (@Sendable (Frame) throws -> Void)?
    private let correlation: UInt64

    public init(msgid: UInt32, payload: [UInt8], correlation: UInt64 = 0, responder: (@Sendable (Frame) throws -> Void)? = nil) {
        self.msgid = msgid
        self.payload = payload
        self.correlation = correlation
        self.responder = responder
    }

    /// Whether the sender waits for a reply.
    public var isRequest: Bool { responder != nil }

    /// Replies to a request.
    /// - Throws: ``IPCError/Code/unsupportedOperation`` for a one-way message; the connection's
    ///   send errors otherwise.
    public func reply(_ payload: [UInt8]) throws {
        guard let responder else {
            throw IPCError(code: .unsupportedOperation, message: "message \(msgid) is one-way and takes no reply")
        }
        try responder(Frame(kind: .reply, msgid: msgid, correlation: correlation, payload: payload))
    }

    /// Tells the requester that the request failed.
    public func fail(_ description: String) throws {
        guard let responder else {
            throw IPCError(code: .unsupportedOperation, message: "message \(msgid) is one-way and takes no reply")
        }
        try responder(Frame(kind: .failure, msgid: msgid, correlation: correlation, payload: Array(description.utf8)))
    }
}

/// Where a ``RequestHandler``'s tasks run.
public enum RequestHandlerExecutor: Sendable {
    /// The serving threads of the transport's engine (the default; IPCEngine's
    /// `ServingExecutor`): the handler never runs on the loop's thread, whatever it does. The
    /// loop queues its job and wakes one sleeping serving thread directly; the reply is written
    /// from that thread, one thread hand-over after the loop read the request. A handler that
    /// blocks its thread holds one of them (there is one per CPU, at least two) as it would
    /// hold one of Swift's global pool. A transport without them uses ``global``.
    case servingThreads
    /// Swift's global concurrent executor: off the loop as ``servingThreads`` is, the job
    /// handed to the pool's own scheduling (measured: more context switches per request).
    case global
    /// The executor of the event loop that read the request: no thread hand-over to start the handler,
    /// and a reply computed at once goes out before the loop reads on. The handler's code
    /// runs **on the loop** until it first suspends, and again each time it resumes there:
    /// code that blocks instead of suspending stalls every connection. A transport without a
    /// loop executor runs the task on the global executor.
    case eventLoop
    /// A task executor of the application's.
    case custom(any TaskExecutor)
}

/// Options for either side of a connection.
public struct ConnectionOptions: Sendable {
    /// Payloads above this length are refused by send and by the receiver's decoder (before the
    /// payload is buffered).
    public var maximumPayloadLength: Int
    /// Answers requests, as tasks off the receive path (``RequestHandler``). When this and
    /// ``onLoopRequestHandler`` are `nil`, requests are delivered through
    /// ``MessageConnection/messages`` and answered with ``ReceivedMessage/reply(_:)``.
    public var requestHandler: RequestHandler?
    /// How many requests of one connection ``requestHandler`` handles at once. `1` (the default)
    /// handles them one at a time in arrival order, as an XPC connection's serial queue does; a
    /// larger bound lets up to that many overlap (replies then come in the order they finish).
    /// Requests beyond the bound wait, counted against ``messageBufferLimit``: a connection
    /// whose waiting requests reach it stops being read, as for ``MessageConnection/messages``.
    public var maximumConcurrentRequests = 1
    /// Where ``requestHandler``'s tasks run. See ``RequestHandlerExecutor``.
    public var requestHandlerExecutor: RequestHandlerExecutor = .servingThreads
    /// The fast path (``OnLoopRequestHandler``): answers requests synchronously on the receive
    /// path. Runs on the loop: must not block. Takes precedence over ``requestHandler``.
    public var onLoopRequestHandler: OnLoopRequestHandler?
    /// Makes the ``MessageHandler`` of each connection (called once per connection, so that a
    /// handler can keep per-connection state in its closure). When `nil`, every one-way message
    /// goes to ``MessageConnection/messages``. Runs on the loop: must not block.
    public var makeOnLoopMessageHandler: (@Sendable () -> MessageHandler)?
    /// Makes the ``BorrowingMessageHandler`` of each connection (once per connection, as
    /// ``makeOnLoopMessageHandler``). It sees every one-way message first. When `nil`, payloads are
    /// copied out of the receive buffer as they are decoded. Runs on the loop: must not block.
    public var makeOnLoopBorrowingMessageHandler: (@Sendable () -> BorrowingMessageHandler)?
    /// How much may wait in ``MessageConnection/messages`` for the application to take it.
    /// When a connection's buffer holds this much, its receive path stops reading until the
    /// application takes a message (the peer's sends then wait, and time out), so a fast
    /// sender cannot make the receiver grow without bound; nothing is dropped. A transport
    /// whose receive path serves several connections cannot wait for one: it invalidates that
    /// connection with ``IPCError/Code/receiveBufferFull`` instead.
    public var messageBufferLimit = BufferLimit(messages: 16_384, bytes: 64 << 20)

    /// A limit in messages and in payload bytes; whichever is reached first counts.
    public struct BufferLimit: Sendable, Hashable {
        public var messages: Int
        public var bytes: Int

        public init(messages: Int, bytes: Int) {
            precondition(messages > 0 && bytes > 0, "a buffer limit must be positive")
            self.messages = messages
            self.bytes = bytes
        }
    }
    /// How the receive path and a waiting requester wait for the peer: block at once (the
    /// default), or spin for a bounded time first. See ``WaitStrategy``.
    public var waitStrategy: WaitStrategy
    /// On stream transports: how long the receiver waits for the next byte of a frame it has
    /// started to receive. A peer that sends part of a frame and then nothing for this long is
    /// dropped with ``IPCError/Code/truncatedFrame`` (a protocol error), so a stalled or hostile
    /// peer cannot hold a half-received frame forever. An idle connection (between frames) is
    /// never timed out. `nil` waits forever.
    public var stalledFrameTimeout: Duration? = .seconds(30)
    /// Listeners only (a connecting side ignores it): the most connections the listener keeps at
    /// once, counting clients in the middle of connecting. A client past it is turned away as
    /// busy, and its connect (or, where a stream socket's connect completes before the listener
    /// decides, its first request) fails with ``IPCError/Code/endpointNotFound`` whose cause is
    /// ``IPCError/ListenerBusy`` (a transport makes it with ``IPCError/listenerBusy(_:answered:)``, so that
    /// ``IPCError/isListenerBusy`` tells it from nobody listening): it may try again once a
    /// connection has ended. The connections it keeps are served as before. `nil` (the
    /// default): bounded only by the process's descriptors. Transports that honour it declare
    /// ``TransportCapabilities/supportsConnectionLimit``.
    public var maximumConnections: Int? = nil

    public init(maximumPayloadLength: Int = 64 << 20, requestHandler: RequestHandler? = nil, waitStrategy: WaitStrategy = .blocking) {
        self.maximumPayloadLength = maximumPayloadLength
        self.requestHandler = requestHandler
        self.waitStrategy = waitStrategy
    }

    public static var defaults: ConnectionOptions { ConnectionOptions() }

    public static func defaults(_ configure: (inout ConnectionOptions) -> Void) -> ConnectionOptions {
        var options = ConnectionOptions()
        configure(&options)
        return options
    }
}

/// One end of an established conversation between two processes.
///
/// Lifecycle: a connection is valid until it is invalidated, either locally with
/// ``invalidate()`` or because the peer went away or broke the protocol. Invalidation happens
/// exactly once and is the last thing a connection reports: ``messages`` finishes, pending
/// requests fail with ``IPCError/Code/peerInvalidated``, then the invalidation handler runs.
public protocol MessageConnection: AnyObject, Sendable {
    /// The peer's kernel-verified credentials, where the transport can know them.
    var peer: PeerCredentials? { get }

    /// One-way messages, and requests when no request handler is set, in arrival order.
    /// Finishes when the connection is invalidated. Single consumer.
    var messages: AsyncStream<ReceivedMessage> { get }

    /// Sends a one-way message; returns once the kernel has it. Synchronous: when the peer's
    /// buffer is full it waits on the calling thread (for callers on threads of their own, and
    /// for handlers on the receive path). From `async` code the suspending overload
    /// ``send(_:msgid:timeout:)-async`` is chosen instead.
    /// - Throws: ``IPCError/Code/invalidated`` if the connection is invalid,
    ///   ``IPCError/Code/payloadTooLarge`` above the maximum, ``IPCError/Code/sendTimeout`` if it
    ///   could not be queued in time, ``IPCError/Code/peerInvalidated`` if the peer went away.
    func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws

    /// Sends a one-way message, suspending (not blocking a thread) while the peer's buffer is
    /// full. Cancelling the task fails a send whose frame has not begun to be written with
    /// `CancellationError`; one already begun is finished (or times out), so the stream is never
    /// torn. A transport without a suspending path gets a default that calls the synchronous send.
    ///
    /// It returns once the transport has accepted the message: the kernel has it, or the
    /// transport holds it for a write it makes itself, before any message sent after it (the
    /// engine's transports hold the one-way messages a task sends on their event loop's thread
    /// and write them together at the end of the loop's round; docs/ENGINE.md, "Held writes").
    /// A message accepted that way and never written ends the connection; it is not dropped.
    ///
    /// `nonisolated(nonsending)`, as ``send(contentsOf:msgid:timeout:)`` and
    /// ``request(_:msgid:sendTimeout:receiveTimeout:)`` are: it runs on the caller's executor (the
    /// caller's actor, or the connection's loop for a task that prefers it), so it starts
    /// without an executor check, and it must never block that executor. A conforming type may
    /// implement it as a plain `async` function, which then runs on the generic executor (the
    /// task's preferred executor, else the global one).
    /// - Throws: what the synchronous send throws; `CancellationError`.
    nonisolated(nonsending) func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws

    /// Sends one-way messages, in order, each with `msgid`, suspending while the peer's buffer
    /// is full: what a loop of ``send(_:msgid:timeout:)-async`` over `payloads` does, and the
    /// default is that loop. A transport that can writes several at once, in one system call
    /// (the engine's stream sockets: up to 64 messages or 256 KiB a call). Each message has the
    /// whole `timeout`, from when its turn comes.
    /// - Throws: what the asynchronous send throws, for the first message that failed: the
    ///   messages before it were sent, it and those after it were not (a message begun and not
    ///   finished invalidates the connection, as a send's does).
    nonisolated(nonsending) func send(contentsOf payloads: [[UInt8]], msgid: UInt32, timeout: Duration) async throws

    /// The executor on which a task should run to have its replies delivered without a thread
    /// hand-over (the event loop that reads this connection), or `nil` if the transport has none.
    /// Use it with `withTaskExecutorPreference(_:operation:)`.
    var preferredTaskExecutor: (any TaskExecutor)? { get }

    /// Sends a request and waits for its reply.
    /// - Throws: everything ``send(_:msgid:timeout:)`` throws; ``IPCError/Code/receiveTimeout``
    ///   if no reply arrived in time (the connection stays valid); ``IPCError/Code/peerInvalidated``
    ///   if the connection became invalid while waiting; ``IPCError/Code/transportFailure`` if the
    ///   peer's handler failed.
    nonisolated(nonsending) func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8]

    /// Sets the handler that runs once, when the connection becomes invalid. If it already is,
    /// the handler runs at once, on the calling thread.
    func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void)

    /// Why the connection became invalid, or `nil` while it is valid.
    var invalidationReason: InvalidationReason? { get }

    /// Invalidates the connection and releases its resources. Idempotent.
    func invalidate()
}

extension MessageConnection {
    /// Not `nonisolated(nonsending)`, unlike the requirement: the synchronous send it calls may
    /// wait on its thread, and a plain `async` function keeps that wait off the caller's actor.
    /// (A task that prefers an event loop still runs it there: transports on the engine have a
    /// suspending send of their own.)
    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        try Task.checkCancellation()
        // A non-async closure, so that the synchronous overload is the one called.
        let sendNow: () throws -> Void = { try self.send(payload, msgid: msgid, timeout: timeout) }
        try sendNow()
    }

    public var preferredTaskExecutor: (any TaskExecutor)? { nil }

    public nonisolated(nonsending) func send(contentsOf payloads: [[UInt8]], msgid: UInt32, timeout: Duration) async throws {
        for payload in payloads {
            try await send(payload, msgid: msgid, timeout: timeout)
        }
    }
}

/// The listening side of an endpoint.
public protocol MessageListener: AnyObject, Sendable {
    associatedtype Connection: MessageConnection

    var endpoint: Endpoint { get }

    /// Connections as they are accepted (after the accept filter). Finishes when the listener closes.
    var connections: AsyncStream<Connection> { get }

    /// The connections that are currently valid.
    var activeConnections: [Connection] { get }

    /// Sends a one-way message to every valid connection and returns how many took it. A
    /// connection whose send fails is invalidated; the others still get the message.
    @discardableResult
    func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int

    /// Stops accepting, invalidates every connection and removes the endpoint. Idempotent.
    func close()
}

/// A kind of inter-process transport. Implementations live in `Sources/Transports/<Name>/`.
public protocol MessageTransport: Sendable {
    associatedtype Listener: MessageListener where Listener.Connection == Connection
    associatedtype Connection: MessageConnection

    /// A short stable name used on the command line and in reports, such as `unix-socket`.
    var name: String { get }

    var capabilities: TransportCapabilities { get }

    /// Starts listening on `endpoint`, creating the group directory (owner-only) if needed.
    /// - Throws: ``IPCError/Code/endpointInUse`` if a live process listens there (a stale endpoint
    ///   left by a dead listener is reclaimed); ``IPCError/Code/invalidEndpoint`` if the group
    ///   directory is writable by anyone but its owner or owned by another user;
    ///   ``IPCError/Code/transportFailure``.
    func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> Listener

    /// Connects to a listening endpoint.
    /// - Throws: ``IPCError/Code/endpointNotFound`` if nobody listens there;
    ///   ``IPCError/Code/invalidEndpoint`` if the group directory is one a listener would refuse
    ///   (writable by anyone but its owner, or owned by another user: whoever controls it could
    ///   be the one listening); ``IPCError/Code/accessDenied``; ``IPCError/Code/transportFailure``.
    func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> Connection

    /// Connects from `async` code without holding one of Swift's cooperative threads while the
    /// listener answers. A transport whose connect waits (a handshake) suspends instead; the
    /// default runs the synchronous connect on a thread of its own (``runBlocking(_:)``).
    /// - Throws: what the synchronous ``connect(to:options:)`` throws; `CancellationError`.
    func connect(to endpoint: Endpoint, options: ConnectionOptions) async throws -> Connection
}

extension MessageTransport {
    public func connect(to endpoint: Endpoint, options: ConnectionOptions) async throws -> Connection {
        try Task.checkCancellation()
        return try await runBlocking { try self.connect(to: endpoint, options: options) as Connection }
    }
}
