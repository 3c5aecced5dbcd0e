import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCSystem
import IPCTestSupport
import Testing
import IPCFraming

/// The spin-then-block wait strategy against a real peer process that spins too: requests and
/// one-way messages arrive exactly as with blocking waits, also after the spin time has run out
/// and both ends have gone to sleep. No timing is asserted.
@Suite("Wait strategies", .usesMessageQueues)
struct WaitStrategyTests {
    static let spinning = TransportCatalog.names.filter(TransportCatalog.supportsSpinning)
    static let strategy = WaitStrategy.spinThenBlock(.microseconds(200))

    /// A peer process serving with ``strategy``, and a connection to it that spins too.
    static func connectSpinning(_ transportName: String, group: borrowing TestGroup) async throws -> (PeerProcess, any MessageConnection) {
        let endpoint = try group.endpoint("\(group.directory.identifier).spin-\(transportName)")
        let peer = try await runBlocking { try PeerProcess(transport: transportName, framing: .binary, endpoint: endpoint, role: .server, waitStrategy: strategy) }
        do {
            let connection = try await TransportCatalog.transport(named: transportName, framing: .binary)
                .connect(to: endpoint, options: .defaults { $0.waitStrategy = strategy })
            return (peer, connection)
        } catch {
            peer.stop()
            throw error
        }
    }

    @Test("the transports that can poll say so; file-presenter cannot")
    func capabilities() {
        #expect(Self.spinning == ["unix-socket", "message-port", "notify"])
        #expect(!TransportCatalog.supportsSpinning("file-presenter"))
        #expect(WaitStrategy.blocking.name == "blocking" && !WaitStrategy.blocking.spins)
        #expect(Self.strategy.spinDuration == .microseconds(200) && Self.strategy.name == "spin-then-block")
    }

    @Test("a spin time is a Duration; a strategy is encoded in nanoseconds, as before")
    func spinDuration() throws {
        var strategy = WaitStrategy(spinFor: .microseconds(75))
        #expect(strategy.spinDuration == .microseconds(75) && strategy.description == "spin-then-block (75 µs)")
        strategy.spinDuration = .zero
        #expect(strategy == .blocking && !strategy.spins)
        #expect(WaitStrategy.spinThenBlock(.microseconds(-5)) == .blocking)
        let encoded = try JSONEncoder().encode(WaitStrategy.spinThenBlock())
        #expect(String(decoding: encoded, as: UTF8.self) == #"{"spinNanoseconds":50000}"#)
        #expect(try JSONDecoder().decode(WaitStrategy.self, from: encoded) == WaitStrategy(spinFor: .microseconds(50)))
    }

    @Test("requests and replies, spinning and after falling asleep", arguments: spinning)
    func requestReply(transportName: String) async throws {
        let group = try TestGroup()
        let (peer, connection) = try await Self.connectSpinning(transportName, group: group)
        defer { connection.invalidate(); peer.stop() }
        for index in 0..<300 {
            // Every 50th request after a pause far longer than the spin time: both ends block.
            if index % 50 == 49 { try await Task.sleep(for: .milliseconds(20)) }
            let payload = ConformancePeer.burstPayload(index, size: [4, 64, 4096, 70_000][index % 4])
            let reply = try await withDeadline(seconds: 30, "\(transportName) request \(index)") {
                try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
            }
            #expect(reply == payload, "\(transportName): reply \(index) differs")
        }
    }

    /// An actor whose request spins: `request` runs on its caller's executor, and the wait's
    /// spin must leave the actor free.
    actor Requester {
        private(set) var answered = false

        func delayedEcho(_ connection: any MessageConnection, milliseconds: UInt32) async throws -> [UInt8] {
            let payload = withUnsafeBytes(of: milliseconds.bigEndian) { Array($0) }
            let reply = try await connection.request(payload, msgid: PeerRequest.delayedEcho, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            answered = true
            return reply
        }
    }

    @Test("a request made on an actor spins off the actor: the actor serves other calls while its request spins")
    func spinningRequestLeavesItsActorFree() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("\(group.directory.identifier).spin-actor")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server, waitStrategy: Self.strategy) }
        defer { peer.stop() }
        // Spins for up to a minute, for a reply that would come after 20 s: a spin on the actor's
        // thread would hold the actor until the reply, so that another call to it would find the
        // request answered. No time is asserted, only that order. The call comes 100 ms in; under
        // the full suite's load it once came more than 3 s late, past the reply this test used to
        // wait for, so the reply is now far off and never awaited: invalidating the connection
        // ends the request, and its spinning wait with it.
        let connection = try await TransportCatalog.transport(named: "unix-socket", framing: .binary)
            .connect(to: endpoint, options: .defaults { $0.waitStrategy = .spinThenBlock(.seconds(60)) })
        defer { connection.invalidate() }
        let requester = Requester()
        let reply = Task { try await requester.delayedEcho(connection, milliseconds: 20_000) }
        try await Task.sleep(for: .milliseconds(100))
        let answeredBeforeThisCall = await requester.answered
        #expect(!answeredBeforeThisCall, "the actor answered another call only once its spinning request was done")
        connection.invalidate()
        let outcome = await withDeadlineResult(seconds: 15) { try await reply.value }
        switch outcome {
        case .success:
            Issue.record("the spinning request was answered instead of ending with the connection")
        case .failure(let error):
            // Pending requests fail with peerInvalidated whatever ended the connection (docs/TRANSPORTS.md).
            #expect((error as? IPCError)?.code == .peerInvalidated, "the spinning request ends with the connection's invalidation, not: \(error)")
        }
    }

    @Test("one-way messages reach the peer's consumer, counted by its sink", arguments: spinning)
    func sink(transportName: String) async throws {
        let group = try TestGroup()
        let (peer, connection) = try await Self.connectSpinning(transportName, group: group)
        defer { connection.invalidate(); peer.stop() }
        for _ in 0..<500 {
            try await connection.send([UInt8](repeating: 1, count: 100), msgid: ConformancePeer.Sink.message, timeout: .seconds(10))
        }
        try await connection.send([], msgid: ConformancePeer.Sink.end, timeout: .seconds(10))
        let reply = try #require(try await collect(1, from: connection).first)
        #expect(reply.msgid == ConformancePeer.Sink.report)
        let report = try #require(ConformancePeer.Sink.parseReport(reply.payload))
        #expect(report.messages == 500 && report.bytes == 50_000)
    }

    @Test("a peer killed while the connection spins: invalidation runs once, and a pending request fails instead of waiting", arguments: spinning)
    func peerKilledWhileSpinning(transportName: String) async throws {
        let group = try TestGroup()
        let (peer, connection) = try await Self.connectSpinning(transportName, group: group)
        defer { connection.invalidate(); peer.stop() }
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        // A round trip first, so that both loops spin when the kill comes.
        _ = try await connection.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        let pending = Task {
            try await connection.request([2], msgid: PeerRequest.stall, sendTimeout: .seconds(10), receiveTimeout: .seconds(600))
        }
        try await Task.sleep(for: .milliseconds(50))
        peer.kill()
        #expect(await probe.wait(seconds: 30), "\(transportName): no invalidation after the peer was killed")
        #expect([.peerClosed, .peerDied].contains(probe.reason?.kind), "\(transportName): \(String(describing: probe.reason))")
        let outcome = await withDeadlineResult(seconds: 30) { try await pending.value }
        guard case .failure(let error as IPCError) = outcome else {
            Issue.record("\(transportName): expected the pending request to fail with an IPCError, got \(outcome)")
            return
        }
        // `invalidated` if the request was sent after the invalidation (a slow machine).
        #expect([.peerInvalidated, .invalidated].contains(error.code), "\(transportName): \(error)")
        try await Task.sleep(for: .milliseconds(100))
        #expect(probe.count == 1)
    }
}
