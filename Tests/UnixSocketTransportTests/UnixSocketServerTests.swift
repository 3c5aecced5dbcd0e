import Foundation
import IPCBenchKit
import IPCCore
import IPCEngine
import IPCFraming
import IPCSystem
import IPCTestSupport
import Synchronization
import SystemPackage
import Testing
import UnixSocketTransport
import IPCConformance

/// The listening side: many client processes, broadcast, per-client sends, the accept filter,
/// and endpoint ownership.
@Suite("Unix socket: server with client processes")
struct UnixSocketServerTests {
    private func acceptConnections(_ count: Int, on listener: UnixSocketListener) async throws -> [UnixSocketConnection] {
        let connections = listener.connections
        return try await withDeadline(seconds: 30, "accepting \(count) connections") {
            var accepted: [UnixSocketConnection] = []
            for await connection in connections {
                accepted.append(connection)
                if accepted.count == count { break }
            }
            return accepted
        }
    }

    @Test("broadcast reaches every client; a send to one client reaches only it")
    func broadcastAndUnicast() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("fanout")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let peers = try await runBlocking { try (0..<3).map { _ in try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) } }
        defer { peers.forEach { $0.stop() } }
        let connections = try await acceptConnections(3, on: listener)
        #expect(Set(connections.compactMap { $0.peer?.pid }) == Set(peers.map(\.pid)))

        #expect(listener.broadcast(Array("to all".utf8), msgid: 7, timeout: .seconds(5)) == 3)
        for connection in connections {
            let echoed = try await collect(1, from: connection)
            #expect(echoed.first?.msgid == 7)
            #expect(echoed.first?.payload == Array("to all".utf8))
        }

        // Only the chosen client echoes; the next thing the others echo is the second broadcast.
        try await connections[1].send(Array("just you".utf8), msgid: 8, timeout: .seconds(5))
        #expect(listener.broadcast(Array("again".utf8), msgid: 9, timeout: .seconds(5)) == 3)
        for (index, connection) in connections.enumerated() {
            let expected = index == 1 ? [UInt32(8), 9] : [9]
            let echoed = try await collect(expected.count, from: connection)
            #expect(echoed.map(\.msgid) == expected)
        }
    }

    @Test("the accept filter sees the kernel-verified pid and uid, and a refused client is dropped")
    func acceptFilter() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("filtered")
        let seen = Mutex<[PeerCredentials]>([])
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults) { credentials in
            seen.withLock { $0.append(credentials) }
            return seen.withLock { $0.count } == 1
        }
        defer { listener.close() }
        let accepted = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) }
        defer { accepted.stop() }
        _ = try await acceptConnections(1, on: listener)
        let refused = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) }
        // The refused client's connection is closed at once, so its peer process ends by itself.
        let status = try await withDeadline(seconds: 30, "the refused client exiting") { refused.waitForExit() }
        #expect(status == 0)
        let credentials = seen.withLock { $0 }
        #expect(credentials.map(\.pid) == [accepted.pid, refused.pid])
        #expect(credentials.allSatisfy { $0.uid == getuid() })
        #expect(listener.activeConnections.count == 1)
    }

    @Test("past the clients waiting for a slow accept filter, a client is turned away as busy (isListenerBusy), not dropped without a word; those waiting are served once the filter answers")
    func filterWaitingRoomAnswersBusy() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("waiting-room")
        let gate = DispatchSemaphore(value: 0)
        let judged = Atomic<Int>(0)
        let options = ConnectionOptions.defaults {
            $0.onLoopRequestHandler = { _, payload in payload }
        }
        // The first client's judgement holds the filter until the gate opens; the rest wait.
        let listener = try UnixSocketTransport().listen(at: endpoint, options: options) { _ in
            if judged.add(1, ordering: .relaxed).newValue == 1 { gate.wait() }
            return true
        }
        defer { listener.close() }
        var opened = false
        defer { if !opened { gate.signal() } }
        // Connects complete in the kernel, and the listener accepts in their order: the first
        // goes to the filter, the next wait, up to the acceptor's bound for both together.
        let path = endpoint.path(suffix: ".sock")
        var waiting: [FileDescriptor] = []
        defer { for socket in waiting { try? socket.close() } }
        for _ in 0..<SocketAcceptor.maximumFiltering {
            waiting.append(try UnixSocket.connect(path: path))
        }
        #expect(await poll(seconds: 30) { judged.load(ordering: .relaxed) == 1 })
        let turnedAway = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { turnedAway.invalidate() }
        do {
            _ = try await turnedAway.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            Issue.record("a client past the accept filter's waiting clients was answered")
        } catch let error as IPCError {
            #expect(error.isListenerBusy, "a client past the accept filter's waiting clients failed with \(error), not the busy answer")
            #expect(error.code == .endpointNotFound)
        }
        #expect(judged.load(ordering: .relaxed) == 1, "the filter judged a client past its waiting room")
        // The filter answers: the waiting clients are judged and kept, and a new one is served.
        gate.signal()
        opened = true
        #expect(await poll(seconds: 30) { listener.activeConnections.count == SocketAcceptor.maximumFiltering })
        let later = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { later.invalidate() }
        #expect(try await later.request([2], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [2])
    }

    @Test("a server keeps serving its other clients when one is killed")
    func survivesClientDeath() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("survive")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let victim = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) }
        let survivor = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) }
        defer { survivor.stop() }
        let connections = try await acceptConnections(2, on: listener)
        let victimConnection = try #require(connections.first { $0.peer?.pid == victim.pid })
        let survivorConnection = try #require(connections.first { $0.peer?.pid == survivor.pid })
        let probe = InvalidationProbe()
        probe.attach(to: victimConnection)
        victim.kill()
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerClosed)
        #expect(listener.activeConnections.count == 1)
        let reply = try await survivorConnection.request([5], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
        #expect(reply == [5])
    }

    @Test("a second listener on a live endpoint is refused, in this process and in another")
    func secondListenerRefused() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("owned")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        await expectIPCError(.endpointInUse) { try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil) }
        listener.close()

        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        await expectIPCError(.endpointInUse) { try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil) }
        // The live server was not disturbed.
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(30)) == [1])
    }

    @Test("a stale endpoint left by a killed listener is reclaimed")
    func staleEndpointReclaimed() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("stale")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        peer.kill()
        peer.waitForExit()
        #expect(FileManager.default.fileExists(atPath: endpoint.path(suffix: ".sock")))
        await expectIPCError(.endpointNotFound) { try UnixSocketTransport().connect(to: endpoint, options: .defaults) }
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([3], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(30)) == [3])
    }

    @Test("an on-loop handler that blocks is named in the loop's stall report, with its endpoint")
    func blockingOnLoopHandlerIsReported() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("stalls-\(UUID().uuidString.prefix(8))")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults {
            $0.onLoopRequestHandler = { _, payload in
                usleep(300_000)
                return payload
            }
        }, acceptFilter: nil)
        defer { listener.close() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(30)) == [1])
        let stalls = try EventLoop.shared().stalls
        #expect(stalls.longestMilliseconds >= 300)
        #expect(stalls.culprits.contains { $0.contains("a unix-socket connection to \(endpoint.name)") }, "\(stalls.culprits)")
    }

    @Test("the endpoint is owner-only and the group directory is not world-writable")
    func permissions() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("private")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let attributes = try FileManager.default.attributesOfItem(atPath: endpoint.path(suffix: ".sock"))
        #expect((attributes[.posixPermissions] as? Int) == 0o600)

        let open = try TestGroup()
        chmod(open.directory.path, 0o777)
        await expectIPCError(.invalidEndpoint) {
            try UnixSocketTransport().listen(at: try open.endpoint("exposed"), options: .defaults, acceptFilter: nil)
        }
    }

    @Test("endpoint names cannot escape the group directory")
    func endpointNames() throws {
        let group = GroupDirectory(path: "/tmp/g")
        for bad in ["", "../x", "a/b", ".hidden", String(repeating: "n", count: 65), "sp ace"] {
            #expect(throws: IPCError.self) { try Endpoint(group: group, name: bad) }
        }
        #expect(throws: IPCError.self) { try Endpoint(group: GroupDirectory(path: "relative"), name: "ok") }
        #expect(try Endpoint(group: group, name: "com.example.app-1_2").path(suffix: ".sock") == "/tmp/g/com.example.app-1_2.sock")
    }
}

/// The message buffer behind `messages` is bounded: an application that does not read stops
/// the receive path (and so the peer's sends), and loses nothing.
@Suite("Unix socket: bounded message buffer")
struct UnixSocketMessageBufferTests {
    @Test("a peer bursting into a connection whose application does not read: at most the limit is buffered, then everything arrives in order")
    func backpressure() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("slow-reader")
        let limit = ConnectionOptions.BufferLimit(messages: 8, bytes: 1 << 20)
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults { $0.messageBufferLimit = limit }, acceptFilter: nil)
        defer { listener.close() }
        // 4,000 messages of 1 KiB: far more than the socket's kernel buffers hold.
        let count = 4_000
        let client = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client, burst: (count, 1024)) }
        defer { client.stop() }
        let connection = try await acceptOne(listener)
        // Not reading for a while: the loop fills the buffer to its limit and stops reading.
        try await Task.sleep(for: .milliseconds(500))
        #expect(connection.bufferedMessageCount == limit.messages)
        let received = try await collect(count, from: connection, seconds: 300)
        #expect(received.map(\.msgid) == (0..<count).map { UInt32($0) })
        #expect(received.enumerated().allSatisfy { $0.element.payload == PeerService.burstPayload($0.offset, size: 1024) })
        #expect(connection.bufferedMessageCount <= limit.messages)
    }
}

/// The listener on the event loop: many idle connections cost descriptors, not threads.
@Suite("Unix socket: many connections on one event loop")
struct UnixSocketScaleTests {
    @Test("1,000 connections made in a burst are all accepted without a thread each, and a client process among them is served")
    func thousandConnections() async throws {
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "thousandConnections")
        }
        let group = try TestGroup()
        let endpoint = try group.endpoint("crowd")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        // A client in another process, started first: Foundation's Process.run on Linux has
        // crashed (a bad pointer in memcpy, once in CI) when the spawning process already had
        // some 2,000 descriptors open, so it is started while this process has few.
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .client) }
        defer { peer.stop() }
        let remote = try await withDeadline(seconds: 30, "accepting the client process") {
            while true {
                if let found = listener.activeConnections.first(where: { $0.peer?.pid == peer.pid }) { return found }
                try await Task.sleep(for: .milliseconds(10))
            }
        }
        // Threads from here on (starting the peer process made some of Foundation's own).
        let before = ChildProcessTest.threadCount()
        // Connected back to back, before the loop accepts any: the burst lands in the listen
        // backlog (SOMAXCONN), and the loop drains it.
        let count = 1_000
        var clients: [UnixSocketConnection] = []
        defer { clients.forEach { $0.invalidate() } }
        for _ in 0..<count {
            clients.append(try await UnixSocketTransport().connect(to: endpoint, options: .defaults))
        }
        try await withDeadline(seconds: 60, "accepting \(count) connections") {
            while listener.activeConnections.count < count + 1 { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(listener.activeConnections.count == count + 1)
        // The loop thread serves all 2,000 ends, in a process of its own (a thread per
        // connection would add thousands).
        #expect(ChildProcessTest.threadCount() <= before + 2)
        print("scale: \(count) unix-socket connections accepted, threads \(before) → \(ChildProcessTest.threadCount())")
        // Every client is served: each makes a request through the crowd.
        for client in clients.shuffled().prefix(50) {
            let reply = try await client.request([7, 7], msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
            #expect(reply == [7, 7])
        }
        // And the client in another process answers requests among them.
        for index in 0..<100 {
            let payload = [UInt8](repeating: UInt8(index), count: 64)
            #expect(try await remote.request(payload, msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == payload)
        }
    }
}
