import Foundation
import IPCConformance
import IPCCore
import Synchronization
import IPCFraming

/// What one cycle found.
struct CycleOutcome: Sendable {
    var tally = DeliveryTally()
    var invalidationsExpected = 0
    var invalidationsSeen = 0
    var reasons: [String: Int] = [:]
    var pendingRequests = 0
    var pendingRequestsFailedCorrectly = 0
    var errors: [String] = []

    var violations: Int {
        tally.violations + (invalidationsExpected - invalidationsSeen) + (pendingRequests - pendingRequestsFailedCorrectly) + errors.count
    }

    func describe(_ plan: SoakCyclePlan) -> String {
        var parts = errors
        let tally = tally
        for (count, what) in [(tally.duplicates, "duplicate(s)"), (tally.outOfOrder, "out of order"), (tally.lost, "lost"), (tally.corrupt, "corrupt")] where count > 0 {
            parts.append("\(count) \(what)")
        }
        let cycle = plan.index == 0 ? "warm-up" : "cycle \(plan.index)"
        return "\(plan.transport) \(cycle) (\(plan.role.rawValue), \(plan.kill)): " + parts.joined(separator: "; ")
    }
}

extension SoakTransportResult {
    mutating func record(_ outcome: CycleOutcome, plan: SoakCyclePlan) {
        cycles += 1
        switch (plan.role, plan.kill) {
        case (.peerServes, _): serverKills += 1
        case (.harnessServes, .duringConnect): connectKills += 1
        case (.harnessServes, _): clientKills += 1
        }
        delivery.add(outcome.tally)
        invalidationsExpected += outcome.invalidationsExpected
        invalidationsSeen += outcome.invalidationsSeen
        invalidationReasons.merge(outcome.reasons, uniquingKeysWith: +)
        pendingRequests += outcome.pendingRequests
        pendingRequestsFailedCorrectly += outcome.pendingRequestsFailedCorrectly
        errors += outcome.errors.count
    }
}

/// One soak cycle: a peer process, a connection with it, a kill, and the checks. Runs on a
/// thread of its own (it blocks), bridging to the connection's async API where it must.
final class SoakCycle: Sendable {
    struct Context: Sendable {
        var executable: URL
        var group: GroupDirectory
        var options: SoakOptions

        /// The endpoint a transport's cycles of one role share: each listener reclaims what the
        /// killed listener before it left.
        func endpoint(_ transport: String, _ role: SoakRole) throws -> Endpoint {
            try Endpoint(group: group, name: "\(group.identifier).soak-\(transport)-\(role.shortName)")
        }
    }

    let plan: SoakCyclePlan
    let context: Context
    private let state = Mutex<(phase: String, peer: ExecutablePeer?)>(("starting", nil))

    init(plan: SoakCyclePlan, context: Context) {
        self.plan = plan
        self.context = context
    }

    /// What the cycle is doing, for the watchdog's report.
    var phase: String { state.withLock { $0.phase } }

    private func enter(_ phase: String) {
        state.withLock { $0.phase = phase }
    }

    func killPeer() {
        state.withLock { $0.peer }?.kill()
    }

    private var invalidationDeadline: DispatchTime {
        .now() + .milliseconds(Int(context.options.invalidationDeadline / .milliseconds(1)))
    }

    @Sendable func run() -> CycleOutcome {
        do {
            return try run(try TransportCatalog.transport(named: plan.transport, framing: .binary))
        } catch {
            var outcome = CycleOutcome()
            outcome.errors.append("\(phase): \(error)")
            // Reap a peer the cycle gave up on, so that neither it nor its pipes outlive the cycle.
            if let peer = state.withLock({ $0.peer }) {
                peer.kill()
                peer.stop()
            }
            return outcome
        }
    }

    private func run<T: MessageTransport>(_ transport: T) throws -> CycleOutcome {
        let endpoint = try context.endpoint(plan.transport, plan.role)
        switch plan.role {
        case .peerServes:
            enter("starting the server peer")
            let peer = try startPeer(role: .server, endpoint: endpoint)
            _ = try peer.waitUntilReady(timeout: .seconds(20))
            enter("connecting to the server peer")
            let connection = try transport.connect(to: endpoint, options: .defaults)
            return exchange(with: connection, peer: peer)
        case .harnessServes:
            enter("listening")
            let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
            defer { listener.close() }
            let accepted = Accepted<T.Connection>()
            Task.detached {
                for await connection in listener.connections { accepted.add(connection) }
            }
            enter("starting the client peer")
            let peer = try startPeer(role: .client, endpoint: endpoint)
            if case .duringConnect(let milliseconds) = plan.kill {
                usleep(UInt32(milliseconds) * 1000)
                enter("killing the client peer while it connects")
                peer.kill()
                peer.stop()
                // Let the listener act on whatever the client managed to send before it died.
                usleep(100_000)
                var outcome = CycleOutcome()
                for connection in accepted.all {
                    enter("waiting for invalidation of a connection from a client killed while connecting")
                    expectInvalidation(of: connection, into: &outcome)
                }
                return outcome
            }
            enter("waiting for the client peer to connect")
            _ = try peer.waitUntilReady(timeout: .seconds(20))
            enter("accepting the client peer's connection")
            guard let connection = accepted.first(within: .now() + 10) else {
                throw IPCError(code: .receiveTimeout, message: "no connection accepted within 10 s of the client peer saying READY")
            }
            return exchange(with: connection, peer: peer)
        }
    }

    private func startPeer(role: PeerRole, endpoint: Endpoint) throws -> ExecutablePeer {
        let peer = try ExecutablePeer(executable: context.executable, arguments: [
            "peer", "--transport", plan.transport, "--group", endpoint.group.path, "--endpoint", endpoint.name, "--role", role.rawValue,
        ])
        state.withLock { $0.peer = peer }
        return peer
    }

    private func expectInvalidation(of connection: some MessageConnection, into outcome: inout CycleOutcome) {
        let invalidated = DispatchSemaphore(value: 0)
        let reason = LockedBox<InvalidationReason?>(nil)
        connection.setInvalidationHandler { value in
            reason.value = value
            invalidated.signal()
        }
        outcome.invalidationsExpected += 1
        if invalidated.wait(timeout: invalidationDeadline) == .success, let kind = reason.value?.kind {
            outcome.invalidationsSeen += 1
            outcome.reasons[kind.rawValue, default: 0] += 1
        } else {
            outcome.errors.append("no invalidation within \(context.options.invalidationDeadline) of the peer's death")
            connection.invalidate()
        }
    }

    /// Sends messages and requests until the kill point, kills (or, in a clean cycle, stops)
    /// the peer, and checks what came back.
    private func exchange<C: MessageConnection>(with connection: C, peer: ExecutablePeer) -> CycleOutcome {
        var outcome = CycleOutcome()
        let echoes = EchoLog()
        let streamEnded = DispatchSemaphore(value: 0)
        Task.detached {
            for await message in connection.messages { echoes.append(msgid: message.msgid, payload: message.payload) }
            streamEnded.signal()
        }
        let killer = KillSwitch(peer)
        if case .afterDelay(let milliseconds) = plan.kill {
            Thread.detachNewThread {
                usleep(UInt32(milliseconds) * 1000)
                killer.fire()
            }
        }
        var random = SoakRandom(seed: plan.seed)
        var log = DeliveryLog()
        let limit = switch plan.kill {
        case .afterMessages(let count, _): count
        case .none: min(50, context.options.maximumMessages)
        default: context.options.maximumMessages
        }
        enter("exchanging messages")
        var sequence: UInt64 = 0
        while Int(sequence) < limit, connection.invalidationReason == nil {
            sequence += 1
            let payload = SoakPayload.make(sequence)
            let failure: (any Error)?
            if Int.random(in: 0..<100, using: &random) < 20 {
                switch Pending({ try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) }).result() {
                case .success(let reply):
                    log.sentRequests += 1
                    log.replies.append((sequence, reply))
                    failure = nil
                case .failure(let error):
                    failure = error
                }
            } else {
                log.attempted.insert(sequence)
                do {
                    try connection.send(payload, msgid: SoakPayload.msgid(sequence), timeout: .seconds(5))
                    log.sentOneWay.append(sequence)
                    failure = nil
                } catch {
                    failure = error
                }
            }
            if let failure {
                if !killer.fired { outcome.errors.append("message \(sequence) failed before the kill: \(failure)") }
                break
            }
        }
        var stalled: Pending<[UInt8]>?
        if case .afterMessages(_, stallFirst: true) = plan.kill, connection.invalidationReason == nil {
            enter("leaving a request pending")
            stalled = Pending { try await connection.request([], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(120)) }
            usleep(2000)
        }
        switch plan.kill {
        case .none:
            enter("waiting for every echo")
            let deadline = ContinuousClock.now + context.options.invalidationDeadline
            while echoes.count < log.sentOneWay.count, ContinuousClock.now < deadline { usleep(1000) }
            enter("stopping the peer")
            peer.stop()
        case .afterDelay:
            enter("waiting for the delayed kill")
            killer.waitUntilFired()
        default:
            enter("killing the peer")
            killer.fire()
        }
        enter("waiting for invalidation")
        expectInvalidation(of: connection, into: &outcome)
        if let stalled {
            enter("waiting for the pending request to fail")
            outcome.pendingRequests += 1
            switch stalled.wait(until: invalidationDeadline) {
            case .failure(let error as IPCError) where error.code == .peerInvalidated:
                outcome.pendingRequestsFailedCorrectly += 1
            case .failure(let error as IPCError) where error.code == .invalidated:
                // Made only once the connection was already invalid: it was never pending.
                outcome.pendingRequests -= 1
            case .failure(let error):
                outcome.errors.append("a request pending at the kill failed with \(error), not peerInvalidated")
            case .success:
                outcome.errors.append("a request the peer never answers got a reply")
            case nil:
                outcome.errors.append("a request pending at the kill did not fail within \(context.options.invalidationDeadline) of invalidation")
            }
        }
        enter("waiting for the message stream to finish")
        if streamEnded.wait(timeout: invalidationDeadline) != .success {
            outcome.errors.append("the message stream did not finish after invalidation")
        }
        enter("reaping the peer")
        peer.stop()
        connection.invalidate()
        log.echoes = echoes.all
        outcome.tally = DeliveryCheck.verify(log, requireAll: plan.kill == .none)
        return outcome
    }
}

/// Connections a listener accepted, shared with the cycle's thread.
private final class Accepted<C: MessageConnection>: Sendable {
    private let connections = Mutex<[C]>([])
    private let arrived = DispatchSemaphore(value: 0)

    func add(_ connection: C) {
        connections.withLock { $0.append(connection) }
        arrived.signal()
    }

    var all: [C] { connections.withLock { $0 } }

    func first(within deadline: DispatchTime) -> C? {
        guard arrived.wait(timeout: deadline) == .success else { return nil }
        return connections.withLock { $0.first }
    }
}

/// Kills the peer once, from whichever thread gets there first.
private final class KillSwitch: Sendable {
    private let peer: ExecutablePeer
    private let state = Mutex(false)
    private let done = DispatchSemaphore(value: 0)

    init(_ peer: ExecutablePeer) {
        self.peer = peer
    }

    var fired: Bool { state.withLock { $0 } }

    func fire() {
        let first = state.withLock { fired in
            defer { fired = true }
            return !fired
        }
        guard first else { return }
        peer.kill()
        done.signal()
    }

    func waitUntilFired() {
        done.wait()
        done.signal()
    }
}

/// An async operation started from a blocking thread, whose result that thread waits for.
private final class Pending<T: Sendable>: Sendable {
    private let outcome = Mutex<Result<T, any Error>?>(nil)
    private let done = DispatchSemaphore(value: 0)

    init(_ operation: @escaping @Sendable () async throws -> T) {
        Task.detached { [self] in
            let outcome: Result<T, any Error>
            do {
                outcome = .success(try await operation())
            } catch {
                outcome = .failure(error)
            }
            self.outcome.withLock { $0 = outcome }
            done.signal()
        }
    }

    /// The result, once there is one.
    func result() -> Result<T, any Error> {
        done.wait()
        done.signal()
        return outcome.withLock { $0! }
    }

    /// The result, or `nil` if there is none by `deadline`.
    func wait(until deadline: DispatchTime) -> Result<T, any Error>? {
        guard done.wait(timeout: deadline) == .success else { return nil }
        return outcome.withLock { $0 }
    }
}
