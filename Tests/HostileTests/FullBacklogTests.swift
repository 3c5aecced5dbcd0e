import FilePresenterTransport
import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCSystem
import IPCTestSupport
import NotifyTransport
import Synchronization
import SystemPackage
import Testing
import UnixSocketTransport

/// A listener's socket whose backlog is full: the kernel queues connections there without the
/// listener's help, so a stopped (or hung) listener lets another process fill it, and a
/// blocking `connect(2)` after that waits until the listener accepts, without end.
@Suite("A listener whose backlog is full")
struct FullBacklogTests {
    /// The socket-based transports, each with a short connect timeout.
    static let transports = ["unix-socket", "notify", "file-presenter"]

    static func transport(_ name: String) -> any SocketActivatedTransport {
        switch name {
        case "unix-socket": UnixSocketTransport(connectTimeout: .milliseconds(300))
        case "notify": NotifyTransport(connectTimeout: .milliseconds(300))
        default: FilePresenterTransport(connectTimeout: .milliseconds(300))
        }
    }

    /// Connects without blocking until the socket at `path` takes no more (`EAGAIN`), and
    /// returns the connected sockets.
    static func fill(_ path: String) throws -> [FileDescriptor] {
        var sockets: [FileDescriptor] = []
        do {
            while sockets.count < 20_000 { sockets.append(try UnixSocket.connect(path: path, nonBlocking: true)) }
        } catch let error as IPCError where (error.cause as? Errno) == .resourceTemporarilyUnavailable {
            return sockets
        } catch {
            for socket in sockets { try? socket.close() }
            throw error
        }
        for socket in sockets { try? socket.close() }
        throw IPCError(code: .transportFailure, message: "\(path) took 20,000 connections without its backlog filling")
    }

    /// Connects on a thread of its own and waits up to 30 s for the outcome: `nil` if the
    /// connect still blocks then (it is left to finish when the listener accepts).
    static func connect(_ transport: any MessageTransport, _ endpoint: Endpoint) async -> Result<Void, any Error>? {
        let outcome = Mutex<Result<Void, any Error>?>(nil)
        Thread.detachNewThread {
            let result = Result<Void, any Error> { try transport.connect(to: endpoint, options: .defaults).invalidate() }
            outcome.withLock { $0 = result }
        }
        _ = await poll(seconds: 30) { outcome.withLock { $0 != nil } }
        return outcome.withLock { $0 }
    }

    @Test("a connect to a stopped listener's full backlog ends within the connect timeout, as its busy answer", arguments: transports)
    func stoppedListener(_ name: String) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("stopped")
        let transport = Self.transport(name)
        let peer = try await runBlocking { try PeerProcess(transport: name, framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        defer { kill(peer.pid, SIGCONT) }
        #expect(await stopProcess(peer.pid), "the listener was not seen stopped")
        let flood = try Self.fill(transport.activationSocketPath(for: endpoint))
        let started = ContinuousClock.now
        let outcome = await Self.connect(transport, endpoint)
        let took = ContinuousClock.now - started
        for socket in flood { try? socket.close() }
        kill(peer.pid, SIGCONT)
        switch outcome {
        case nil:
            Issue.record("a connect to a full backlog still blocked after 30 s (connect timeout 300 ms)")
        case .success:
            Issue.record("a stopped listener whose backlog was full gave a connection")
        case .failure(let error):
            let error = try #require(error as? IPCError, "\(error)")
            #expect(error.code == .endpointNotFound, "\(error)")
            #expect(error.listenerBusyCause?.answered == false, "a stopped listener's full backlog did not read as a busy listener that did not answer: \(error)")
            #expect(took < .seconds(20), "took \(took)")
        }
        // Resumed, the listener serves again.
        let served = await poll(seconds: 30) {
            guard let connection = try? transport.connect(to: endpoint, options: .defaults) else { return false }
            connection.invalidate()
            return true
        }
        #expect(served, "the resumed listener took no connection")
    }

    @Test("a full backlog of a socket that no listener of the endpoint holds is nobody listening", arguments: transports)
    func squattedSocket(_ name: String) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("squatted")
        let transport = Self.transport(name)
        let socket = try UnixSocket.listen(path: transport.activationSocketPath(for: endpoint), backlog: 0)
        defer { try? socket.close() }
        let flood = try Self.fill(transport.activationSocketPath(for: endpoint))
        defer { for socket in flood { try? socket.close() } }
        switch await Self.connect(transport, endpoint) {
        case nil:
            Issue.record("a connect to a full backlog still blocked after 30 s (connect timeout 300 ms)")
        case .success:
            Issue.record("a socket that accepts nobody gave a connection")
        case .failure(let error):
            let error = try #require(error as? IPCError, "\(error)")
            #expect(error.code == .endpointNotFound, "\(error)")
            #expect(!error.isListenerBusy, "a socket that no listener of the endpoint holds read as a busy listener: \(error)")
        }
    }
}
