import CIPCShims
import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCPosix
import IPCTestSupport
import NotifyTransport
import Testing

/// The message transport over notifications and a shared store, with peer processes.
@Suite("Notify transport")
struct NotifyTransportTests {
    let transport = NotifyTransport()

    private func ringFiles(_ group: borrowing TestGroup) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: group.directory.path).filter { $0.hasSuffix(".ring") }
    }

    private func accept(_ count: Int, on listener: NotifyListener) async throws -> [NotifyConnection] {
        let connections = listener.connections
        return try await withDeadline(seconds: 30, "accepting \(count) connections") {
            var accepted: [NotifyConnection] = []
            for await connection in connections {
                accepted.append(connection)
                if accepted.count == count { break }
            }
            return accepted
        }
    }

    @Test("request/reply echoes payloads from 0 B to 16 MiB (larger than the ring)")
    func echo() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("echo")
        let peer = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server)
        defer { peer.stop() }
        let connection = try transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(connection.peer?.pid == peer.pid)
        for size in [0, 1, 64, 4096, 65_536, (1 << 20) - 19, 1 << 20, 16 << 20] {
            let payload = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ size) }
            let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
            #expect(reply == payload, "payload of \(size) bytes")
        }
    }

    @Test("bursts of 10,000 messages from each of three senders arrive exactly once, in order")
    func burstsFromSeveralSenders() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("burst")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let count = 10_000
        let senders = try (0..<3).map { _ in
            try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (count, 100))
        }
        defer { senders.forEach { $0.stop() } }
        let connections = try await accept(3, on: listener)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for connection in connections {
                tasks.addTask {
                    let received = try await collect(count, from: connection, seconds: 120)
                    #expect(received.count == count)
                    let outOfPlace = received.enumerated().filter { index, message in
                        message.msgid != UInt32(index) || message.payload != PeerService.burstPayload(index, size: 100)
                    }
                    #expect(outOfPlace.isEmpty, "first out of place: \(String(describing: outOfPlace.first.map { ($0.offset, $0.element.msgid) }))")
                }
            }
            try await tasks.waitForAll()
        }
    }

    @Test("a sender killed while writing a message: no partial message, the next message still arrives, its store is removed")
    func senderKilledMidWrite() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("torn")
        let size = 256 << 20
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.maximumPayloadLength = size }, acceptFilter: nil)
        defer { listener.close() }
        // Two 256 MiB messages, 256 times the ring each. A thread of its own (not one of the
        // test's tasks, which can be starved) spins on the store's write index and kills the
        // sender once 2 MiB of message 1 are published, 254 MiB before it could finish.
        let frame = UInt64(BinaryWireFormat.headerLength + size)
        let killed = LockedValue<(written: UInt64, pid: Int32)?>(nil)
        let directory = group.directory.path
        // Started before the sender exists, so it is watching when the burst begins.
        Thread.detachNewThread {
            let deadline = ContinuousClock.now + .seconds(60)
            var store: (mapping: SharedMapping, writer: Int32)?
            while ContinuousClock.now < deadline {
                guard let (mapping, writer) = store else {
                    // The store is `torn.<writer pid>-<serial>.ring`.
                    let file = (try? FileManager.default.contentsOfDirectory(atPath: directory))?.first { $0.hasSuffix(".ring") }
                    if let file, let pid = Int32(file.dropFirst("torn.".count).prefix { $0.isNumber }),
                        let mapping = try? SharedMapping(path: directory + "/" + file, length: 4096, create: false) {
                        store = (mapping, pid)
                    }
                    continue
                }
                let written = ipc_atomic_load_u64(mapping.word64(at: 64))
                if written >= frame + (2 << 20) {
                    kill(writer, SIGKILL)
                    killed.set((written, writer))
                    return
                }
            }
        }
        let victim = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (2, size))
        let connection = try #require(try await accept(1, on: listener).first)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let delivered = try await withDeadline(seconds: 120, "the burst") { () -> [ReceivedMessage] in
            var delivered: [ReceivedMessage] = []
            for await message in connection.messages { delivered.append(message) }
            return delivered
        }
        let (written, killedPID) = try #require(killed.get(), "the sender never reached message 1")
        #expect(killedPID == victim.pid)
        #expect(written < 2 * frame, "the kill did not land while message 1 was being written")
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerDied)
        // Message 0 whole, and nothing of the half-written message 1.
        #expect(delivered.map(\.msgid) == [0])
        #expect(delivered.first?.payload == PeerService.burstPayload(0, size: size))
        #expect(try ringFiles(group).isEmpty)

        let next = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (1, 64))
        defer { next.stop() }
        let nextConnection = try #require(try await accept(1, on: listener).first)
        let received = try await collect(1, from: nextConnection)
        #expect(received.first?.payload == PeerService.burstPayload(0, size: 64))
    }

    @Test("SIGKILL of the server: the client invalidates once, fails its pending request, and removes its store")
    func serverKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("server")
        let peer = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server)
        let connection = try transport.connect(to: endpoint, options: .defaults)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let pending = Task {
            try await connection.request([1], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(200))
        #expect(try ringFiles(group).count == 1)
        peer.kill()
        let outcome = await withDeadlineResult(seconds: 10) { try await pending.value }
        guard case .failure(let error as IPCError) = outcome else {
            Issue.record("expected the pending request to fail with an IPCError, got \(outcome)")
            return
        }
        #expect(error.code == .peerInvalidated)
        #expect(await probe.wait(seconds: 10))
        #expect(probe.count == 1)
        #expect(try ringFiles(group).isEmpty)
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
    }

    @Test("a dead listener's name can be taken over; a live one's cannot")
    func takeOver() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("owned")
        let peer = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server)
        await expectIPCError(.endpointInUse) { try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil) }
        peer.kill()
        peer.waitForExit()
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload } }, acceptFilter: nil)
        defer { listener.close() }
        let connection = try transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([3], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [3])
    }

    @Test("the store does not grow: a connection's file keeps its size however much passes through")
    func boundedStore() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("bounded")
        let peer = try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server)
        defer { peer.stop() }
        let connection = try transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let file = try #require(try ringFiles(group).first)
        let sizeBefore = try FileManager.default.attributesOfItem(atPath: group.directory.path + "/" + file)[.size] as? Int
        let payload = [UInt8](repeating: 9, count: 256 * 1024)
        for _ in 0..<40 {
            _ = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10))
        }
        let sizeAfter = try FileManager.default.attributesOfItem(atPath: group.directory.path + "/" + file)[.size] as? Int
        #expect(sizeBefore != nil)
        #expect(sizeAfter == sizeBefore)
    }

    @Test("a store corrupted by another process invalidates the connection with a protocol error, no crash")
    func corruptedStore() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("corrupt")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let client = try transport.connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        let server = try #require(try await withDeadline(seconds: 30, "accepting") { () -> NotifyConnection? in
            for await connection in listener.connections { return connection }
            return nil
        })
        let probe = InvalidationProbe()
        probe.attach(to: server)
        // A hostile writer: the client-to-server ring's read index ahead of its write index.
        let file = try #require(try ringFiles(group).first)
        let store = try SharedMapping(path: group.directory.path + "/" + file, length: 4096, create: false)
        store.word64(at: 64).pointee = 5
        store.word64(at: 72).pointee = 10
        FutexCounter(in: store, at: 80).post()
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .protocolError)
        #expect(probe.reason?.error?.code == .malformedFrame)
    }
}
