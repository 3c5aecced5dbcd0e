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
@Suite("A listener whose backlog is full", .serialized)
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

    /// Connects without blocking until the socket at `path` takes no more (`EAGAIN`). Each
    /// socket is closed at once: the connection it queued stays in the backlog until the
    /// listener accepts it, so this holds no descriptors.
    static func fill(_ path: String) throws {
        for _ in 0..<20_000 {
            do {
                try UnixSocket.connect(path: path, nonBlocking: true).close()
            } catch let error as IPCError where (error.cause as? Errno) == .resourceTemporarilyUnavailable {
                return
            }
        }
        throw IPCError(code: .transportFailure, message: "\(path) took 20,000 connections without its backlog filling")
    }

    /// Runs `connect` on a thread of its own, waits up to 30 s for it to end, and returns the
    /// `IPCError` it failed with. Records an issue (and returns `nil`) if it still blocks then
    /// (it is left to finish when the listener accepts), succeeded, or threw anything else.
    static func failure(of connect: @escaping @Sendable () throws -> Void) async -> IPCError? {
        let outcome = Mutex<Result<Void, any Error>?>(nil)
        Thread.detachNewThread {
            let result = Result<Void, any Error> { try connect() }
            outcome.withLock { $0 = result }
        }
        _ = await poll(seconds: 30) { outcome.withLock { $0 != nil } }
        switch outcome.withLock({ $0 }) {
        case nil:
            Issue.record("a connect to a full backlog still blocked after 30 s")
        case .success:
            Issue.record("a full backlog gave a connection")
        case .failure(let error as IPCError):
            return error
        case .failure(let error):
            Issue.record("the connect failed with \(error), not an IPCError")
        }
        return nil
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
        try Self.fill(transport.activationSocketPath(for: endpoint))
        let started = ContinuousClock.now
        let failure = await Self.failure { try transport.connect(to: endpoint, options: .defaults).invalidate() }
        let took = ContinuousClock.now - started
        kill(peer.pid, SIGCONT)
        if let error = failure {
            #expect(error.code == .endpointNotFound, "\(error)")
            #expect(error.listenerBusyCause?.answered == false, "a stopped listener's full backlog did not read as a busy listener that did not answer: \(error)")
            #expect(took >= .milliseconds(300) && took < .seconds(20), "took \(took), with a connect timeout of 300 ms")
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
        try Self.fill(transport.activationSocketPath(for: endpoint))
        if let error = await Self.failure(of: { try transport.connect(to: endpoint, options: .defaults).invalidate() }) {
            #expect(error.code == .endpointNotFound, "\(error)")
            #expect(!error.isListenerBusy, "a socket that no listener of the endpoint holds read as a busy listener: \(error)")
        }
    }

    @Test("signals that interrupt the wait for room do not make it longer than the timeout")
    func interruptedWait() async throws {
        let group = try TestGroup()
        let path = try group.endpoint("interrupted").path(suffix: ".sock")
        let socket = try UnixSocket.listen(path: path, backlog: 0)
        defer { try? socket.close() }
        // The socket a connect returns has no send timeout left.
        let probe = try UnixSocket.connect(path: path, timeout: .seconds(1)) { true }
        var timeout = timeval(tv_sec: -1, tv_usec: -1)
        var length = socklen_t(MemoryLayout<timeval>.size)
        #expect(getsockopt(probe.rawValue, SOL_SOCKET, SO_SNDTIMEO, &timeout, &length) == 0)
        #expect(timeout.tv_sec == 0 && timeout.tv_usec == 0, "the send timeout stayed set: \(timeout)")
        try probe.close()
        try Self.fill(path)
        // A zero timeout is no wait, not a send timeout of zero (which the kernel reads as none).
        let zeroStarted = ContinuousClock.now
        guard let zero = await Self.failure(of: { try UnixSocket.connect(path: path, timeout: .zero) { true }.close() }) else { return }
        #expect(zero.listenerBusyCause?.answered == false, "\(zero)")
        #expect(ContinuousClock.now - zeroStarted < .seconds(5), "a zero timeout's connect took \(ContinuousClock.now - zeroStarted)")

        // A handler that does nothing, without SA_RESTART: each signal ends the kernel's wait
        // with EINTR. (SIGURG is no one's else in the test process; its default is to ignore it.)
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        var previous = sigaction()
        #expect(sigaction(SIGURG, &action, &previous) == 0)
        defer { sigaction(SIGURG, &previous, nil) }

        let thread = Mutex<pthread_t?>(nil)
        // The connect's outcome and how long it took, timed on its thread (which may start late
        // on a loaded machine).
        let outcome = Mutex<(result: Result<Void, any Error>, took: Duration)?>(nil)
        Thread.detachNewThread {
            // (Threads here start with SIGURG blocked.)
            var unblock = sigset_t()
            sigemptyset(&unblock)
            sigaddset(&unblock, SIGURG)
            pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
            thread.withLock { $0 = pthread_self() }
            let started = ContinuousClock.now
            let result = Result<Void, any Error> { try UnixSocket.connect(path: path, timeout: .milliseconds(500)) { true }.close() }
            let took = ContinuousClock.now - started
            // Under the lock the signals are sent with: none goes to this thread once it ends.
            thread.withLock { target in
                target = nil
                outcome.withLock { $0 = (result, took) }
            }
        }
        // A signal every 50 ms, for up to 30 s or until the connect ends.
        let started = ContinuousClock.now
        while outcome.withLock({ $0 == nil }), ContinuousClock.now - started < .seconds(30) {
            thread.withLock { target in
                if let target, outcome.withLock({ $0 == nil }) { pthread_kill(target, SIGURG) }
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        guard let (result, took) = outcome.withLock({ $0 }) else {
            Issue.record("a connect interrupted every 50 ms had not ended after 30 s (timeout 500 ms)")
            return
        }
        #expect(took < .seconds(5), "took \(took), with a timeout of 500 ms")
        switch result {
        case .success: Issue.record("a full backlog gave a connection")
        case .failure(let error):
            let error = try #require(error as? IPCError, "\(error)")
            #expect(error.listenerBusyCause?.answered == false, "\(error)")
        }
    }
}
