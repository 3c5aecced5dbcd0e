import Glibc
import IPCCore
import IPCEngine
import IPCPosix
import Synchronization

/// The listening side of the notify transport. Clients announce themselves by creating their
/// store and posting the endpoint's connect name (`<endpoint>.connect` in the group's
/// ``NotifyCenter``); the listener then scans the group directory for stores waiting for it.
public final class NotifyListener: MessageListener, @unchecked Sendable {
    // @unchecked: every stored property is immutable or a Mutex.
    public let endpoint: Endpoint
    public let connections: AsyncStream<NotifyConnection>

    private let lock: EndpointLock
    private let options: ConnectionOptions
    private let connectionSink: AsyncStream<NotifyConnection>.Continuation
    private let registration = Mutex<NotifyRegistration?>(nil)

    private struct State {
        var closed = false
        var known: Set<String> = []
        var active: [String: NotifyConnection] = [:]
    }

    private let state = Mutex(State())

    init(endpoint: Endpoint, center: NotifyCenter, options: ConnectionOptions) throws {
        try GroupDirectories.prepare(endpoint.group)
        lock = try EndpointLock(endpoint: endpoint)
        self.endpoint = endpoint
        self.options = options
        (connections, connectionSink) = AsyncStream.makeStream(of: NotifyConnection.self)
        removeStaleStores()
        do {
            let registration = try center.register(NotifyTransport.connectName(endpoint)) { [weak self] in self?.scan() }
            self.registration.withLock { $0 = registration }
        } catch {
            lock.release()
            throw error
        }
        scan()
    }

    public var activeConnections: [NotifyConnection] {
        state.withLock { Array($0.active.values) }
    }

    @discardableResult
    public func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        activeConnections.broadcast(payload, msgid: msgid, timeout: timeout)
    }

    public func close() {
        let connections: [NotifyConnection]? = state.withLock { state in
            guard !state.closed else { return nil }
            state.closed = true
            return Array(state.active.values)
        }
        guard let connections else { return }
        registration.withLock { $0.take() }?.cancel()
        lock.release()
        connectionSink.finish()
        for connection in connections { connection.invalidate() }
    }

    /// Stores of this endpoint in the group directory, by path.
    private func storePaths() -> [String] {
        guard let directory = opendir(endpoint.group.path) else { return [] }
        defer { closedir(directory) }
        let prefix = endpoint.name + "."
        var paths: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            // `<endpoint>.<pid>-<serial>.ring`, and nothing else (another endpoint's name may
            // begin with this one's).
            guard name.hasPrefix(prefix), name.hasSuffix(".ring") else { continue }
            let identity = name.dropFirst(prefix.count).dropLast(".ring".count).split(separator: "-", omittingEmptySubsequences: false)
            guard identity.count == 2, identity.allSatisfy({ !$0.isEmpty && $0.allSatisfy(\.isNumber) }) else { continue }
            paths.append(endpoint.group.path + "/" + name)
        }
        return paths
    }

    /// We hold the endpoint's lock, so stores that a previous listener accepted, or whose client
    /// is dead, are left from processes that died; stores still waiting for a live client stay.
    private func removeStaleStores() {
        for path in storePaths() {
            if let store = try? NotifyStore.open(path: path), store.state == .waiting, ProcessWatcher.isAlive(pid: store.clientPID) {
                continue
            }
            unlink(path)
        }
    }

    private func scan() {
        for path in storePaths() {
            let isNew = state.withLock { state in
                guard !state.closed, !state.known.contains(path) else { return false }
                state.known.insert(path)
                return true
            }
            guard isNew, let store = try? NotifyStore.open(path: path), store.state == .waiting else { continue }
            guard let connection = try? NotifyConnection(store: store, isClient: false, peerPID: store.clientPID, options: options, onInvalidated: { [weak self] _ in
                _ = self?.state.withLock { state in
                    state.active.removeValue(forKey: path)
                    state.known.remove(path)
                }
            }) else { continue }
            state.withLock { $0.active[path] = connection }
            do {
                try connection.start()
            } catch {
                continue
            }
            store.accept()
            connectionSink.yield(connection)
        }
    }
}
