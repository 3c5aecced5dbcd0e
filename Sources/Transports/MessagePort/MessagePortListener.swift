import CIPCShims
import Dispatch
import Glibc
public import IPCCore
public import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// A local message port: a queue registered under a name, read by the process's event loop,
/// which takes every client's fragments and answers requests in arrival order (like a
/// CFMessagePort's run-loop source).
public final class MessagePortListener: MessageListener, @unchecked Sendable {
    // @unchecked: `readBuffer` and `polled` are touched only by the loop's thread; the rest is immutable or
    // behind a Mutex.
    public var endpoint: Endpoint { claim.endpoint }
    public var connections: AsyncStream<MessagePortConnection> { claim.connections }

    /// The group directory, the endpoint's lock, the registry of connections and the close order.
    private let claim: ClaimedEndpoint
    private let queue: MessageQueue
    private let messageSize: Int
    /// The port queue's receive buffer, one message long (loop thread only).
    private let readBuffer: UnsafeMutableRawBufferPointer
    private let readToken = Mutex<UInt64?>(nil)
    private let options: ConnectionOptions
    private var loop: EventLoop { claim.loop }

    /// Where each admitted client's fragments go (the registry keeps its connection).
    private struct Routes {
        var clients: [UInt32: Client] = [:]
    }

    /// One admitted client: its connection and the channel the listener delivers its fragments to.
    private struct Client {
        let connection: EngineConnection
        let channel: MessagePortChannel
        let queueName: String
        let pid: Int32
        /// The descriptor of the port's queue its hello came through, which it writes to: the
        /// port's own, or a replacement (``checkName()``).
        let port: CInt
    }

    private let routes = Mutex(Routes())
    private let queueLimits: (maximumMessages: Int, messageSize: Int)
    /// Queues made after ``queue``'s name was taken from it (see ``checkName()``), with their
    /// registrations: clients that opened an earlier one still write there.
    private let replacements = Mutex(Replacements())

    /// The replacement queues, and whether ``close()`` gave the name up. A name check holds this
    /// lock from its first look at the name to its last change of it, and ``close()`` takes it
    /// to give the name up: a check that began before a close either ends before the name goes
    /// (and the close closes what it made) or finds it gone, and never makes a queue under a
    /// name that a successor may hold by then.
    private struct Replacements {
        var queues: [Replacement] = []
        var nameGivenUp = false
    }

    /// A queue made after the name was taken from the port's queue, and its registration.
    private struct Replacement {
        let queue: MessageQueue
        let token: UInt64
        /// Name checks in a row that found it left by the name, unused and empty.
        var idleChecks = 0
    }
    /// The most connections one client process may hold to this port; its next hello is not answered.
    public static let maximumClientsPerProcess = 64
    /// How often the listener checks that its name still leads to its queue.
    static let nameCheckPeriod: Duration = .seconds(1)
    /// Decides on each client from its credentials, before it is welcomed.
    private let acceptFilter: AcceptFilter?

    init(endpoint: Endpoint, options: ConnectionOptions, queueLimits: (maximumMessages: Int, messageSize: Int), acceptFilter: AcceptFilter? = nil) throws {
        self.acceptFilter = acceptFilter
        try MessagePortTransport.checkScoped(endpoint)
        let claim = try ClaimedEndpoint(endpoint)
        let name = PortNames.serverQueue(endpoint)
        do {
            // We hold the name's lock, so a queue still registered belongs to a dead server, or
            // to another user who took the name first (which is said, not `endpointInUse`).
            try MessageQueue.removeName(name)
            Self.removeReplyQueuesOfDeadClients(endpoint)
            queue = try MessageQueue.create(name: name, maximumMessages: queueLimits.maximumMessages, messageSize: queueLimits.messageSize)
        } catch {
            claim.close {}
            throw error
        }
        do {
            messageSize = try queue.messageSize()
            try PortFragmentHeader.checkQueueMessageSize(messageSize, of: "the message port's queue (its transport's queueLimits.messageSize)")
        } catch {
            queue.close()
            claim.close { MessageQueue.unlink(name: name) }
            throw error
        }
        self.claim = claim
        self.options = options
        self.queueLimits = queueLimits
        readBuffer = .allocate(byteCount: messageSize, alignment: 8)
        do {
            let token = try register(queue, polled: true)
            readToken.withLock { $0 = token }
        } catch {
            close()
            throw error
        }
        scheduleNameCheck()
    }

    /// Has the loop read `queue` for this listener.
    /// - Parameter polled: whether the spinning loop polls the queue itself (the port's own
    ///   queue; a replacement queue, rare, waits for readiness: the two would share one buffer).
    private func register(_ queue: MessageQueue, polled: Bool = false) throws -> UInt64 {
        let handler = PortReader(queue: queue, pollsWhileSpinning: polled && options.waitStrategy.spins)
        handler.listener = self
        return try loop.register(queue.descriptor.rawValue, interest: .readable, waitStrategy: options.waitStrategy, handler: handler)
    }

    private func scheduleNameCheck() {
        loop.schedule(at: monotonicNanoseconds() &+ Self.nameCheckPeriod.wholeNanoseconds) { [weak self] in self?.checkName() }
    }

    /// Makes sure the port's name leads to a queue this listener reads (loop thread, once a
    /// period). Any process of this user can remove the name, or put a queue of its own there,
    /// and every new client would then fail to connect (or talk to that queue) until the
    /// listener restarted. We hold the endpoint's lock, so the name is ours: a queue of someone
    /// else's there is removed, and a new queue is made under the name, read beside the old one,
    /// whose clients keep writing to it.
    ///
    /// A replacement queue whose name was taken from it in turn is kept only while a client that
    /// said hello through it lives, or a message waits in it: without that, a process that
    /// removed the name again and again would make the listener keep a queue each time, until the
    /// user's queue quota was gone (and every other port of the user with it).
    private func checkName() {
        guard !claim.isClosed else { return }
        defer { scheduleNameCheck() }
        let used = Set(routes.withLock { $0.clients.values.map(\.port) })
        let hook = willReplaceName.withLock { $0 }
        let pruned: [Replacement] = replacements.withLock { state in
            guard !state.nameGivenUp else { return [] }
            let current = MessageQueue.inode(named: queue.name)
            let pruned = Self.prune(&state.queues, current: current, used: used)
            let ours = [queue.inode] + state.queues.map(\.queue.inode)
            if let current, ours.contains(current) { return pruned }
            hook?()
            if current != nil { MessageQueue.unlink(name: queue.name) }
            guard let replacement = try? MessageQueue.create(name: queue.name, maximumMessages: queueLimits.maximumMessages, messageSize: queueLimits.messageSize) else { return pruned }
            guard let token = try? register(replacement) else {
                replacement.close()
                return pruned
            }
            state.queues.append(Replacement(queue: replacement, token: token))
            return pruned
        }
        for replacement in pruned {
            loop.deregister(replacement.token)
            replacement.queue.close()
        }
    }

    /// Takes out of `queues` the replacements that the name no longer leads to (its queue's
    /// inode is `current`), that no client uses (`used`: the queues' descriptors that admitted
    /// clients write to) and no message waits in, at two checks in a row: a client that opened
    /// one just before the name left it has a period to say hello there. The caller stops
    /// reading them and closes them.
    private static func prune(_ queues: inout [Replacement], current: UInt64?, used: Set<CInt>) -> [Replacement] {
        for index in queues.indices {
            let queue = queues[index].queue
            let idle = queue.inode != current && !used.contains(queue.descriptor.rawValue) && (try? queue.messageCount()) == 0
            queues[index].idleChecks = idle ? queues[index].idleChecks + 1 : 0
        }
        defer { queues.removeAll { $0.idleChecks >= 2 } }
        return queues.filter { $0.idleChecks >= 2 }
    }

    /// Tests: runs in a name check that is about to replace the port's queue, before it does.
    let willReplaceName = Mutex<(@Sendable () -> Void)?>(nil)

    /// The id the listener gave the client of `connection`, which its fragments carry (tests).
    func clientID(of connection: EngineConnection) -> UInt32? {
        routes.withLock { $0.clients.first { $0.value.connection === connection }?.key }
    }

    /// The replacement queues the listener reads now (tests).
    var replacementQueueCount: Int { replacements.withLock { $0.queues.count } }

    deinit {
        readBuffer.deallocate()
    }

    /// Forwards readiness to the listener; the loop's table keeps it, and so the listener,
    /// until ``close()`` deregisters it.
    private final class PortReader: EventHandler, @unchecked Sendable {
        // @unchecked: `listener` is set once, before the registration can report anything.
        var listener: MessagePortListener?
        let queue: MessageQueue
        let pollsWhileSpinning: Bool

        init(queue: MessageQueue, pollsWhileSpinning: Bool) {
            self.queue = queue
            self.pollsWhileSpinning = pollsWhileSpinning
        }

        var stallLabel: String {
            "the receive path of the message-port listener \(listener?.endpoint.name ?? queue.name) and the on-loop handlers it ran"
        }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            listener?.readPort(queue)
        }

        func pollWhileSpinning() -> Bool {
            listener?.pollPort(queue) ?? false
        }
    }

    /// What ``pollPort(_:)`` took from the port's own queue (its length in ``readBuffer``), for
    /// the next ``readPort(_:)``. Loop thread only, and never accessed across a call that could
    /// reach it again: unchecked, as the runtime's dynamic exclusivity checks cost about 150
    /// instructions a message here (callgrind).
    @exclusivity(unchecked) private var polled = PolledRead()

    /// The spinning loop's poll of the port's own queue (loop thread): takes a message if there
    /// is one and keeps it for ``readPort(_:)``: one `mq_timedreceive` per message that arrives.
    private func pollPort(_ queue: MessageQueue) -> Bool {
        guard !claim.isClosed else { return false }
        return polled.poll { try queue.receiveIfReady(into: readBuffer) }
    }

    public var activeConnections: [MessagePortConnection] { claim.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        claim.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        // The queue's name goes before the endpoint's name is given up, so a successor's queue
        // is never removed.
        var replacementsLeft: [Replacement] = []
        guard claim.close(giveUpName: {
            replacementsLeft = self.replacements.withLock { state in
                state.nameGivenUp = true
                MessageQueue.unlink(name: queue.name)
                defer { state.queues.removeAll() }
                return state.queues
            }
            Self.removeReplyQueuesOfDeadClients(self.endpoint)
        }) else { return }
        // The loop may be reading the queues right now: it stops watching and closes them.
        let token = readToken.withLock { $0.take() }
        let replacements = replacementsLeft
        loop.execute { [loop, queue] in
            if let token { loop.deregister(token) }
            queue.close()
            for replacement in replacements {
                loop.deregister(replacement.token)
                replacement.queue.close()
            }
        }
    }

    /// Takes one message from one of the port's queues per readiness report (loop thread; the
    /// loop is level-triggered, so what is left is reported again on its next round).
    private func readPort(_ queue: MessageQueue) {
        guard !claim.isClosed else { return }
        // The port's own message may wait in the buffer: a replacement queue is then read on the
        // loop's next round (it is level-triggered), not over that message.
        if polled.isHolding, queue.descriptor != self.queue.descriptor { return }
        guard let count = try? polled.take({ try queue.receiveIfReady(into: readBuffer) }) else { return }
        let bytes = UnsafeRawBufferPointer(rebasing: readBuffer[..<count])
        // Anyone who can open the queue can write to it; a message that does not parse, or
        // names no client, is dropped rather than taken out on a client.
        guard let header = try? PortFragmentHeader(parsing: bytes) else { return }
        let body = UnsafeRawBufferPointer(rebasing: bytes[PortFragmentHeader.length...])
        switch header.kind {
        case .hello:
            receiveHello(Array(body), through: queue.descriptor.rawValue)
        case .wake:
            return
        default:
            // The channel and the connection only: a copy of the whole entry would retain and
            // release its queue name as well.
            guard let (channel, connection) = routes.withLock({ $0.clients[header.sender].map { ($0.channel, $0.connection) } }) else { return }
            channel.deliver(header, body) { connection.readNow() }
        }
    }

    /// The credentials the kernel records for process `pid`: its effective uid and gid
    /// (`/proc/<pid>/status`, the second field of `Uid:` and `Gid:`); `nil` if unreadable.
    static func credentials(of pid: Int32) -> PeerCredentials? {
        guard let status = readSmallFile("/proc/\(pid)/status") else { return nil }
        func effective(_ field: String) -> UInt32? {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field) }) else { return nil }
            let values = line.dropFirst(field.count).split(whereSeparator: { $0 == "\t" || $0 == " " })
            return values.count >= 2 ? UInt32(values[1]) : nil
        }
        guard let uid = effective("Uid:"), let gid = effective("Gid:") else { return nil }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }

    /// Whether `pid` names a running process whose owner is this process's user.
    private static func isLiveProcessOfThisUser(_ pid: Int32) -> Bool {
        var status = stat()
        return stat("/proc/\(pid)", &status) == 0 && status.st_uid == geteuid()
    }

    /// Whether process `pid` holds the message queue `name` open: a client that says hello has
    /// just created its reply queue and holds it, so a hello naming a process that does not
    /// (another client, or pid 1, with a queue the sender made) is forged. `/proc/<pid>/fd` of a
    /// process of this user is readable; an open queue's link reads as its name.
    static func process(_ pid: Int32, holdsQueue name: String) -> Bool {
        let directory = "/proc/\(pid)/fd"
        guard let entries = opendir(directory) else { return false }
        defer { closedir(entries) }
        var target = [CChar](repeating: 0, count: Int(PATH_MAX))
        while let entry = readdir(entries) {
            let fd = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard fd.first?.isNumber == true else { continue }
            let count = readlink(directory + "/" + fd, &target, target.count - 1)
            guard count > 0 else { continue }
            if String(decoding: target.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self) == name { return true }
        }
        return false
    }

    /// Removes the reply queues of this port's clients whose processes are gone. A client killed
    /// after creating its reply queue but before a server read its hello leaves one that nobody
    /// else knows of (a server removes those of the clients it admitted), and queues outlive
    /// their processes and count against a small per-user quota. Queue names can be listed only
    /// where their file system is mounted at /dev/mqueue; elsewhere this does nothing.
    static func removeReplyQueuesOfDeadClients(_ endpoint: Endpoint) {
        guard let directory = opendir("/dev/mqueue") else { return }
        defer { closedir(directory) }
        let prefix = PortNames.serverQueue(endpoint).dropFirst() + ".r"
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            guard name.hasPrefix(prefix) else { continue }
            // `<server queue>.r<pid>.<serial>`, as ``PortNames/replyQueue(_:pid:serial:)`` names them.
            let identity = name.dropFirst(prefix.count).split(separator: ".", omittingEmptySubsequences: false)
            guard identity.count == 2, let pid = Int32(identity[0]), pid > 0, Int(identity[1]) != nil,
                !ProcessWatcher.isAlive(pid: pid),
                // The server queue of an endpoint whose name merely looks like a reply queue's.
                (try? Endpoint(group: endpoint.group, name: endpoint.name + ".r" + identity.joined(separator: "."))).flatMap(EndpointLock.owner(of:)) == nil
            else { continue }
            MessageQueue.unlink(name: "/" + name)
        }
    }

    /// What a hello claims, checked (``checkHello(_:)``), for ``admit(_:through:)``.
    private struct CheckedHello: Sendable {
        let pid: Int32
        let replyName: String
        let replyQueue: MessageQueue
        let replySize: Int
        let credentials: PeerCredentials
        /// The accept filter refused it.
        let filtered: Bool
    }

    /// Hellos taken off the port's queue and not checked yet, at most: one past this is dropped,
    /// and its client's connect times out.
    static let maximumPendingHellos = 256
    private let pendingHellos = Mutex(0)
    /// Where hellos are checked, one at a time: the checks read `/proc` (a scan of the claimed
    /// process's descriptors, which a process holding tens of thousands makes take 60-120 ms)
    /// and run the accept filter, the user's code; on the loop they held up every connection of
    /// the process while they ran.
    private let helloChecks = DispatchQueue(label: "ipcbench.message-port.hellos")

    /// Has a hello checked off the loop, then admits its client on the loop (loop thread).
    private func receiveHello(_ body: [UInt8], through port: CInt) {
        let taken = pendingHellos.withLock { pending in
            guard pending < Self.maximumPendingHellos else { return false }
            pending += 1
            return true
        }
        guard taken else { return }
        helloChecks.async { [weak self] in
            guard let self else { return }
            let hello = claim.isClosed ? nil : checkHello(body)
            pendingHellos.withLock { $0 -= 1 }
            guard let hello else { return }
            loop.execute { [weak self] in
                guard let self else { return hello.replyQueue.close() }
                admit(hello, through: port)
            }
        }
    }

    /// Checks what a hello claims, its pid and the name of its reply queue, as far as it can be
    /// checked, and runs the accept filter (off the loop): `nil` if it is not to be answered.
    private func checkHello(_ body: [UInt8]) -> CheckedHello? {
        guard body.count > 4 else { return nil }
        let pid = Int32(bitPattern: body.withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }.bigEndian)
        let replyName = String(decoding: body[4...], as: UTF8.self)
        // A queue message carries no kernel-verified sender, so check what a hello claims as far
        // as it can be checked: the reply queue is named for the pid (`<server queue>.r<pid>.<serial>`),
        // that pid is a live process of this user that holds the queue open, and no client
        // already uses that queue (a hello naming another client's queue would otherwise send
        // to it, and remove it later; looked at again when it is admitted).
        let serial = replyName.dropFirst((queue.name + ".r\(pid).").count)
        guard pid > 0, replyName.hasPrefix(queue.name + ".r\(pid)."), !serial.isEmpty, serial.allSatisfy(\.isASCII), serial.allSatisfy(\.isNumber),
            Self.isLiveProcessOfThisUser(pid), Self.process(pid, holdsQueue: replyName),
            !routes.withLock({ $0.clients.values.contains { $0.queueName == replyName } }),
            let replyQueue = try? MessageQueue.open(name: replyName, forWriting: true)
        else { return nil }
        // The client made its queue, of any size the kernel allows: one too small for a
        // fragment is not answered (a welcome or refusal could not be trusted to fit either).
        guard let replySize = try? replyQueue.messageSize(), (try? PortFragmentHeader.checkQueueMessageSize(replySize, of: replyName)) != nil,
            let credentials = Self.credentials(of: pid)
        else {
            replyQueue.close()
            return nil
        }
        let filtered = acceptFilter.map { !$0(credentials) } ?? false
        return CheckedHello(pid: pid, replyName: replyName, replyQueue: replyQueue, replySize: replySize, credentials: credentials, filtered: filtered)
    }

    /// Registers a client whose hello passed ``checkHello(_:)`` (loop thread), or tells it that
    /// it is refused.
    private func admit(_ hello: CheckedHello, through port: CInt) {
        let (pid, replyName, replyQueue, replySize, credentials) = (hello.pid, hello.replyName, hello.replyQueue, hello.replySize, hello.credentials)
        // Another hello for the same queue may have been admitted since it was checked; and a
        // client removes its reply queue's name only once welcomed or when it gives up, so a
        // queue without its name is a client that stopped waiting while its hello was checked
        // (a slow accept filter): it is not admitted, or it would hold a connection nobody uses.
        guard !claim.isClosed, !routes.withLock({ $0.clients.values.contains { $0.queueName == replyName } }), !replyQueue.isUnlinked else {
            replyQueue.close()
            return
        }
        // Told, so that its connect fails at once with the reason; it never gets an id. Without
        // waiting (this is the loop's thread): a client whose queue is full at its hello is not
        // told, and its connect times out.
        func refuse(_ reason: PortRefusal) {
            try? FragmentWriter(queue: replyQueue, messageSize: messageSize)
                .sendControl(PortFragmentHeader(kind: .refused, msgid: reason.rawValue), deadline: .after(.zero))
            replyQueue.close()
        }
        // A process's clients are bounded, so that one process (which could make queues as long
        // as its user's quota lasts) cannot make the listener hold without end.
        if routes.withLock({ $0.clients.values.count(where: { $0.pid == pid }) }) >= Self.maximumClientsPerProcess { return refuse(.tooManyConnectionsFromProcess) }
        if hello.filtered { return refuse(.acceptFilter) }
        if let limit = options.maximumConnections, routes.withLock({ $0.clients.count }) >= limit { return refuse(.listenerFull) }
        // Random, not counted: the port's queue takes fragments from anyone of the user, and the
        // id in them is all that says whose they are, so one that could be guessed (1, 2, ...)
        // would let another process send, or say goodbye, in a live client's name. Drawn again
        // if 0 or in use. (The id is 32 bits of the wire's header: guessing one takes about 2^31
        // fragments a client, each dropped as naming nobody.)
        let id = routes.withLock { routes in
            var id: UInt32 = 0
            while id == 0 || routes.clients[id] != nil { id = UInt32.random(in: 1...UInt32.max) }
            return id
        }
        let channel: MessagePortChannel
        do {
            channel = try MessagePortChannel(
                role: .server(clientQueueName: replyName), outbound: replyQueue,
                messageSize: min(messageSize, replySize), senderID: 0,
                maximumPayloadLength: options.maximumPayloadLength
            )
        } catch {
            replyQueue.close()
            return
        }
        claim.keep { onInvalidated in
            let connection = try EngineConnection(
                channel: channel, peer: credentials, options: options, loop: loop, label: "a message-port client of \(endpoint.name)"
            ) { [weak self] connection in
                onInvalidated(connection)
                _ = self?.routes.withLock { $0.clients.removeValue(forKey: id) }
            }
            routes.withLock { $0.clients[id] = Client(connection: connection, channel: channel, queueName: replyName, pid: pid, port: port) }
            do {
                // Without waiting (this is the loop's thread, which serves every client): a reply
                // queue already full at the hello ends the connection, and the client's connect
                // times out. The welcome goes before the connection is yielded, so nothing the
                // listener's user sends can reach the client ahead of its id.
                try FragmentWriter(queue: replyQueue, messageSize: messageSize)
                    .sendControl(PortFragmentHeader(kind: .welcome, sender: id), deadline: .after(.zero))
                try connection.watchPeerProcess(pid)
            } catch {
                connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
                throw error
            }
            return connection
        }
    }
}
