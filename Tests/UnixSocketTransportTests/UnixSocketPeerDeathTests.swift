import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing
import UnixSocketTransport
import IPCConformance
import IPCEngine

/// The peer is a separate process killed with SIGKILL. Deadlines are generous (10 s): the tests
/// check that invalidation happens, not how fast; the harness measures the speed.
@Suite("Unix socket: peer death")
struct UnixSocketPeerDeathTests {
    @Test("SIGKILL of an idle peer invalidates once, last, and later sends fail")
    func idlePeerKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("idle")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        let messages = connection.messages
        let drain = Task.detached { for await _ in messages {} }
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        peer.kill()
        #expect(await probe.wait(seconds: 10))
        // The message stream has ended too (this would hang otherwise; the deadline turns that into a failure).
        try await withDeadline(seconds: 10, "the message stream ending") { await drain.value }
        #expect(probe.reason?.kind == .peerClosed)
        connection.invalidate()
        connection.invalidate()
        try await Task.sleep(for: .milliseconds(100))
        #expect(probe.count == 1)
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
        await expectIPCError(.invalidated) {
            try await connection.request([1], msgid: 1, sendTimeout: .seconds(1), receiveTimeout: .seconds(1))
        }
        // A handler set after invalidation runs at once.
        let late = InvalidationProbe()
        late.attach(to: connection)
        #expect(late.count == 1)
    }

    @Test("SIGKILL in the middle of a request fails that request with peerInvalidated")
    func peerKilledMidRequest() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("midrequest")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        let pending = Task {
            try await connection.request([1, 2, 3], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(300))
        peer.kill()
        let outcome = await withDeadlineResult(seconds: 10) { try await pending.value }
        guard case .failure(let error as IPCError) = outcome else {
            Issue.record("the pending request did not fail with an IPCError: \(outcome)")
            return
        }
        #expect(error.code == .peerInvalidated)
    }

    @Test("writing to a killed peer gives a typed error, never SIGPIPE")
    func noSigpipe() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("sigpipe")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        peer.kill()
        peer.waitForExit()
        var failure: IPCError?
        for _ in 0..<1000 where failure == nil {
            do { try await connection.send([UInt8](repeating: 1, count: 4096), msgid: 1, timeout: .seconds(1)) } catch let error as IPCError {
                failure = error
            }
        }
        // Reaching this line at all means the process was not killed by SIGPIPE.
        let code = try #require(failure).code
        #expect(code == .peerInvalidated || code == .invalidated)
    }
}
