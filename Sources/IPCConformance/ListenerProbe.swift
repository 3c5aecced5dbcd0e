import IPCCore
import Synchronization

/// A listener under observation: each accepted connection becomes a ``ConnectionProbe`` the
/// moment it is accepted.
final class ListenerProbe: Sendable {
    let listener: ErasedListener
    private let accepted = Mutex<(probes: [ConnectionProbe], taken: Int)>(([], 0))

    init(_ listener: ErasedListener) {
        self.listener = listener
        Task { [weak self] in
            for await connection in listener.connections {
                let probe = ConnectionProbe(connection)
                self?.accepted.withLock { $0.probes.append(probe) }
            }
        }
    }

    var endpoint: Endpoint { listener.endpoint }

    /// Every accepted connection not yet returned by this method or ``nextConnection(within:_:)``.
    func takeAccepted() -> [ConnectionProbe] {
        accepted.withLock { state in
            defer { state.taken = state.probes.count }
            return Array(state.probes[state.taken...])
        }
    }

    /// The next accepted connection not yet returned by this method or ``takeAccepted()``.
    /// - Throws: ``ConformanceFailure`` if none is accepted within `limit`.
    func nextConnection(within limit: Duration, _ what: String) async throws -> ConnectionProbe {
        let arrived = await poll(within: limit) { self.accepted.withLock { $0.probes.count > $0.taken } }
        try check(arrived, "\(what): the listener accepted no connection within \(limit)")
        return accepted.withLock { state in
            defer { state.taken += 1 }
            return state.probes[state.taken]
        }
    }
}
