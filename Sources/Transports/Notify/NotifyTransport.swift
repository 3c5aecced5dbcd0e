import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// Messages over named notifications and a shared store: the MMWormhole pattern without its
/// defects, on the notify(3) model (``NotifyCenter``).
///
/// A connection's messages live in a store file in the group directory (``NotifyStore``: one
/// byte ring per direction, frames in the binary framing); the writer publishes a frame and posts
/// the ring's counter to wake the reader. Every message is delivered exactly once and in order
/// however posts coalesce, bursts wait for ring space instead of overwriting, and a frame is seen
/// only once it is whole. Peer death is detected through the peer's process.
///
/// Files: `G/notify.center` (the notification table), `G/<endpoint>.lock` (held by the
/// listener), `G/<endpoint>.<pid>-<serial>.ring` (one per connection, removed when it ends).
public struct NotifyTransport: MessageTransport {
    public typealias Connection = NotifyConnection
    public typealias Listener = NotifyListener

    /// Bytes per direction in each connection's store.
    public var ringCapacity: Int
    /// How long a connect waits for the listener to accept.
    public var connectTimeout: Duration

    public init(ringCapacity: Int = 1 << 20, connectTimeout: Duration = .seconds(5)) {
        self.ringCapacity = ringCapacity
        self.connectTimeout = connectTimeout
    }

    public var name: String { "notify" }

    public var capabilities: TransportCapabilities {
        TransportCapabilities(
            maximumPayloadLength: ConnectionOptions.defaults.maximumPayloadLength,
            preservesOrder: true,
            supportsRequestReply: true,
            supportsBroadcast: true,
            supportsAcceptFilter: false,
            peerDeathDetection: .processWatch,
            supportsSpinning: true
        )
    }

    /// - Throws: an accept filter is refused with ``IPCError/Code/unsupportedOperation`` (a store
    ///   file carries no kernel-verified identity beyond its owner, who is always this user);
    ///   otherwise what ``MessageTransport/listen(at:options:acceptFilter:)`` documents.
    public func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> NotifyListener {
        guard acceptFilter == nil else {
            throw IPCError(code: .unsupportedOperation, message: "the notify transport cannot filter clients by credentials")
        }
        return try NotifyListener(endpoint: endpoint, center: NotifyCenter(group: endpoint.group), options: options)
    }

    public func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> NotifyConnection {
        try GroupDirectories.verify(endpoint.group)
        guard let serverPID = EndpointLock.owner(of: endpoint), ProcessWatcher.isAlive(pid: serverPID) else {
            throw IPCError(code: .endpointNotFound, message: "no live process listens on \(endpoint)")
        }
        let center = try NotifyCenter(group: endpoint.group)
        let path = endpoint.path(suffix: ".\(getpid())-\(Self.nextSerial()).ring")
        let store = try NotifyStore.create(path: path, ringCapacity: ringCapacity)
        try center.post(Self.connectName(endpoint))
        guard store.awaitAcceptance(timeout: connectTimeout, serverPID: serverPID) == .accepted else {
            store.close()
            unlink(path)
            throw IPCError(code: .endpointNotFound, message: "the listener on \(endpoint) did not accept (it died, or took longer than \(connectTimeout))")
        }
        let connection = try NotifyConnection(store: store, isClient: true, peerPID: store.serverPID, options: options)
        try connection.start()
        return connection
    }

    static func connectName(_ endpoint: Endpoint) -> String {
        endpoint.name + ".connect"
    }

    private static let serial = Atomic<Int>(0)

    private static func nextSerial() -> Int {
        serial.add(1, ordering: .relaxed).newValue
    }
}

extension MessageTransport where Self == NotifyTransport {
    /// Notifications plus a shared store.
    public static var notify: NotifyTransport { NotifyTransport() }
}
