import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization
import SystemPackage

/// The listening side of the notify transport: accepts on the endpoint's rendezvous socket on
/// the event loop, passes each client through the accept filter with its kernel-verified
/// credentials, takes its hello (the store and the doorbells) without ever blocking the loop,
/// and serves the connection on the loop from then on.
///
/// A client that connects and says nothing is dropped after the handshake timeout, and at most
/// ``maximumPendingHandshakes`` may be in the middle of connecting at once (the next ones are
/// told `busy`), so clients that never finish cannot hold the listener's descriptors.
public final class NotifyListener: MessageListener, Sendable {
    public let endpoint: Endpoint
    /// Clients that connected and have not finished their hello, at most.
    public static let maximumPendingHandshakes = 64

    private let path: String
    private let listenFD: CInt
    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let acceptFilter: AcceptFilter?
    private let handshakeTimeout: Duration
    private let registry = ConnectionRegistry<NotifyConnection>()
    private let loop: EventLoop
    private let watch = Mutex<EventLoop.ReadinessWatch?>(nil)
    private let pending = PendingHandshakes()

    /// Sockets of clients between connecting and their hello, by descriptor. A class of its own
    /// so that closing (from `deinit` too) can hand it to the loop without the listener.
    private final class PendingHandshakes: Sendable {
        struct Entry: Sendable {
            var watch: EventLoop.ReadinessWatch
            var peer: PeerCredentials
            /// Tells this handshake from a later one on a reused descriptor number.
            var serial: UInt64
        }

        let entries = Mutex<[CInt: Entry]>([:])
        private let nextSerial = Atomic<UInt64>(0)

        func add(_ fd: CInt, watch: EventLoop.ReadinessWatch, peer: PeerCredentials) -> UInt64 {
            let serial = nextSerial.add(1, ordering: .relaxed).newValue
            entries.withLock { $0[fd] = Entry(watch: watch, peer: peer, serial: serial) }
            return serial
        }

        /// Stops waiting for `fd`'s hello (loop thread), if it is pending (and is handshake
        /// `serial`, if given). Returns its entry if so; the caller answers or closes `fd`.
        func remove(_ fd: CInt, serial: UInt64? = nil, on loop: EventLoop) -> Entry? {
            let entry: Entry? = entries.withLock { entries in
                guard let entry = entries[fd], serial == nil || entry.serial == serial else { return nil }
                entries[fd] = nil
                return entry
            }
            if let entry { loop.cancel(entry.watch) }
            return entry
        }
    }

    init(endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?, handshakeTimeout: Duration) throws {
        try GroupDirectories.prepare(endpoint.group)
        let lock = try EndpointLock(endpoint: endpoint)
        let path = NotifyRendezvous.socketPath(endpoint)
        // We hold the endpoint's lock, so a socket file still here belongs to a dead listener.
        unlink(path)
        let loop: EventLoop
        do {
            loop = try EventLoop.shared()
            listenFD = try UnixSocket.listen(path: path)
        } catch {
            lock.release()
            throw error
        }
        self.endpoint = endpoint
        self.path = path
        self.lock = lock
        self.options = options
        self.acceptFilter = acceptFilter
        self.handshakeTimeout = handshakeTimeout
        self.loop = loop
        do {
            let watching = try loop.watchReadable(FileDescriptor(rawValue: listenFD)) { [weak self] in self?.acceptWaiting() }
            watch.withLock { $0 = watching }
        } catch {
            unlink(path)
            closeDescriptor(listenFD)
            lock.release()
            throw error
        }
    }

    public var connections: AsyncStream<NotifyConnection> { registry.connections }

    public var activeConnections: [NotifyConnection] { registry.activeConnections }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        registry.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        guard let toInvalidate = registry.close() else { return }
        // Remove the socket file before giving up the name, so a successor never loses its own file.
        unlink(path)
        UnixSocket.shutdown(listenFD)
        lock.release()
        let watch = watch.withLock { $0 }
        loop.execute { [listenFD, loop, pending] in
            if let watch { loop.cancel(watch) }
            closeDescriptor(listenFD)
            for fd in pending.entries.withLock({ Array($0.keys) }) where pending.remove(fd, on: loop) != nil {
                closeDescriptor(fd)
            }
        }
        for connection in toInvalidate { connection.invalidate() }
    }

    deinit {
        close()
    }

    /// Accepts every connection waiting (on the loop's thread).
    private func acceptWaiting() {
        while !registry.isClosed {
            let fd: CInt
            do {
                switch try UnixSocket.acceptIfReady(listenFD) {
                case .accepted(let accepted): fd = accepted
                case .none, .closed: return
                }
            } catch {
                // A shortage of descriptors or memory: try again shortly instead of spinning.
                if let watch = watch.withLock({ $0 }) { loop.pause(watch, forNanoseconds: 10_000_000) }
                return
            }
            guard let peer = try? UnixSocket.peerCredentials(fd) else {
                closeDescriptor(fd)
                continue
            }
            guard acceptFilter?(peer) ?? true else {
                answer(fd, .refused)
                continue
            }
            guard pending.entries.withLock({ $0.count }) < Self.maximumPendingHandshakes else {
                answer(fd, .busy)
                continue
            }
            guard let handshake = try? loop.watchReadable(FileDescriptor(rawValue: fd), { [weak self] in self?.takeHello(fd) }) else {
                closeDescriptor(fd)
                continue
            }
            let serial = pending.add(fd, watch: handshake, peer: peer)
            loop.schedule(at: monotonicNanoseconds() &+ handshakeTimeout.wholeNanoseconds) { [weak self] in self?.drop(fd, serial: serial) }
        }
    }

    /// Sends the answer and closes the rendezvous socket (a client that does not read it is
    /// not waited for: the socket is non-blocking for this one word).
    private func answer(_ fd: CInt, _ status: NotifyRendezvous.Status) {
        let bytes = NotifyRendezvous.statusBytes(status)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        closeDescriptor(fd)
    }

    /// Stops waiting for a client's hello (loop thread), answering `status` if given, and closes
    /// its socket, if it was still pending.
    private func drop(_ fd: CInt, serial: UInt64? = nil, answering status: NotifyRendezvous.Status? = nil) {
        guard pending.remove(fd, serial: serial, on: loop) != nil else { return }
        if let status { answer(fd, status) } else { closeDescriptor(fd) }
    }

    /// Takes a client's hello when its socket is readable (loop thread): one message of
    /// ``NotifyRendezvous/helloLength`` bytes with the store and the two doorbells.
    private func takeHello(_ fd: CInt) {
        guard let peer = pending.entries.withLock({ $0[fd]?.peer }) else { return }
        var hello = [UInt8](repeating: 0, count: NotifyRendezvous.helloLength)
        var descriptors = [CInt](repeating: -1, count: NotifyRendezvous.descriptorCount)
        var received: CInt = 0
        let count = hello.withUnsafeMutableBytes { bytes in
            descriptors.withUnsafeMutableBufferPointer { fds in
                ipc_receive_with_descriptors(fd, bytes.baseAddress, UInt(bytes.count), fds.baseAddress, CInt(fds.count), &received)
            }
        }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK { return }
        let handed = Array(descriptors.prefix(Int(max(0, received))))
        // Whatever is wrong with it, the client gets an answer and nothing it handed over stays open.
        guard count == NotifyRendezvous.helloLength, handed.count == NotifyRendezvous.descriptorCount,
            let capacity = NotifyRendezvous.ringCapacity(ofHello: hello[...]),
            let channel = try? Self.channel(memfd: handed[0], ownBell: handed[1], peerBell: handed[2], ringCapacity: capacity, options: options)
        else {
            handed.forEach { closeDescriptor($0) }
            drop(fd, answering: .malformed)
            return
        }
        closeDescriptor(handed[0])
        guard let connection = try? NotifyTransport.serve(channel, peer: peer, options: options, onInvalidated: { [weak registry] connection in
            registry?.remove(connection)
        }) else {
            drop(fd, answering: .malformed)
            return
        }
        // Registered before the client hears it is accepted, so that a client that has
        // connected is among ``activeConnections``.
        guard registry.add(connection) else {
            connection.invalidate()
            drop(fd, answering: .malformed)
            return
        }
        drop(fd, answering: .accepted)
    }

    /// A channel over what a client handed over, after checking each descriptor is what it
    /// should be: the store (see ``NotifyStore/adopt(memfd:ringCapacity:)``) and two eventfds,
    /// made non-blocking here whatever the client set (a ring must never block the loop).
    /// - Throws: ``IPCError/Code/malformedFrame``.
    private static func channel(memfd: CInt, ownBell: CInt, peerBell: CInt, ringCapacity: Int, options: ConnectionOptions) throws -> NotifyChannel {
        guard ipc_is_eventfd(ownBell) == 1, ipc_is_eventfd(peerBell) == 1, ownBell != peerBell,
            ipc_set_nonblocking(ownBell) == 0, ipc_set_nonblocking(peerBell) == 0
        else {
            throw IPCError(code: .malformedFrame, message: "the doorbells handed over are not two eventfds")
        }
        let store = try NotifyStore.adopt(memfd: memfd, ringCapacity: ringCapacity)
        store.recordServer()
        return NotifyChannel(store: store, isClient: false, ownBell: ownBell, peerBell: peerBell, maximumPayloadLength: options.maximumPayloadLength)
    }
}
