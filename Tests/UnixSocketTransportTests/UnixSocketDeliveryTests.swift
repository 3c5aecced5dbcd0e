import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing
import UnixSocketTransport
import IPCConformance
import IPCEngine

/// Delivery and request/reply against a real peer process (`ipcbench peer`).
@Suite("Unix socket: delivery and request/reply with a peer process")
struct UnixSocketDeliveryTests {
    @Test("request/reply echoes every payload size, both framings", arguments: Framing.allCases)
    func echoAcrossSizes(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("echo")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: framing).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(connection.peer?.pid == peer.pid)
        for size in [0, 1, 64, 4096, 65_536 + 3, 1 << 20, 16 << 20] {
            let payload = periodicBytes(size, step: 31, offset: size)
            let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
            #expect(reply == payload, "payload of \(size) bytes")
        }
    }

    @Test("a message handler takes what it consumes on the receive path; the rest reach messages; one handler per connection")
    func messageHandler() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("handler")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        // Each connection's handler keeps its own list of what it consumed.
        let lists = LockedValue<[[UInt32]]>([])
        let options = ConnectionOptions.defaults {
            $0.makeOnLoopMessageHandler = {
                let index = lists.withLock { lists in
                    lists.append([])
                    return lists.count - 1
                }
                return { message, _ in
                    // Consumes even msgids.
                    guard message.msgid % 2 == 0 else { return false }
                    lists.withLock { $0[index].append(message.msgid) }
                    return true
                }
            }
        }
        let connections = try (0..<2).map { _ in try UnixSocketTransport().connect(to: endpoint, options: options) }
        defer { connections.forEach { $0.invalidate() } }
        #expect(lists.get().count == 2)
        for connection in connections {
            // The peer echoes each one-way message back with its msgid.
            for index in 0..<200 {
                try await connection.send([UInt8(index & 0xFF)], msgid: UInt32(index), timeout: .seconds(10))
            }
            let passed = try await collect(100, from: connection)
            #expect(passed.map(\.msgid) == Array(stride(from: 1, through: 199, by: 2)).map(UInt32.init))
        }
        // The handler ran before the later odd messages were passed on: its lists are complete.
        let evens = Array(stride(from: 0, through: 198, by: 2)).map(UInt32.init)
        #expect(lists.get() == [evens, evens])
    }

    @Test("one-way messages arrive in order, once each")
    func orderedDelivery() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("order")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let count = 5_000
        let sender = Task.detached {
            for index in 0..<count {
                // Sizes vary so that frames straddle the reader's buffer boundaries.
                var payload = withUnsafeBytes(of: UInt32(index).bigEndian, Array.init)
                payload += [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: index % 300)
                try connection.send(payload, msgid: UInt32(index), timeout: .seconds(30))
            }
        }
        let received = try await collect(count, from: connection)
        try await sender.value
        #expect(received.count == count)
        for (index, message) in received.enumerated() {
            #expect(message.msgid == UInt32(index))
            #expect(message.payload.count == 4 + index % 300)
            #expect(Array(message.payload.prefix(4)) == withUnsafeBytes(of: UInt32(index).bigEndian, Array.init))
        }
    }

    @Test("one-way messages of mixed sizes, large among small, arrive in order and whole, every framing", arguments: Framing.allCases)
    func mixedSizesInOrder(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("mixed")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: framing).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        // A large frame's rest is the kernel's to receive; the frames just behind it (small,
        // empty, or large again) are read when it ends, on both sides (the peer echoes each).
        func payload(_ index: Int) -> [UInt8] {
            let size = switch index % 4 {
            case 0: (1 << 20) + index
            case 1: index
            case 2: (200 << 10) + index
            default: 0
            }
            return periodicBytes(size, step: 13, offset: index)
        }
        let count = 48
        let sender = Task.detached {
            for index in 0..<count { try connection.send(payload(index), msgid: UInt32(index), timeout: .seconds(30)) }
        }
        let received = try await collect(count, from: connection)
        try await sender.value
        #expect(received.map(\.msgid) == (0..<count).map(UInt32.init))
        for (index, message) in received.enumerated() where message.payload != payload(index) {
            Issue.record("message \(index): \(message.payload.count) bytes, not the \(payload(index).count) sent")
        }
        #expect(connection.invalidationReason == nil)
    }

    @Test("concurrent requests each get their own reply")
    func correlation() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("correlate")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for index in 0..<200 {
                tasks.addTask {
                    let payload = Array("request \(index)".utf8) + [UInt8](repeating: UInt8(index % 256), count: index * 37)
                    let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
                    #expect(reply == payload)
                }
            }
            try await tasks.waitForAll()
        }
    }

    @Test("receive timeout is its own error and leaves the connection valid")
    func receiveTimeout() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("timeout")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.kill() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        await expectIPCError(.receiveTimeout) {
            try await connection.request([1, 2, 3], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .milliseconds(200))
        }
        #expect(connection.invalidationReason == nil)
    }

    @Test("send timeout is its own error when the peer does not read")
    func sendTimeout() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("sendtimeout")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.kill() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        // A peer that reads nothing: its process stopped, its connection open.
        kill(peer.pid, SIGSTOP)
        defer { kill(peer.pid, SIGCONT) }
        let big = [UInt8](repeating: 7, count: 1 << 20)
        await expectIPCError(.sendTimeout) {
            for _ in 0..<64 {
                try connection.send(big, msgid: 9, timeout: .milliseconds(300))
            }
        }
    }

    @Test("an async send of large frames to a peer that stopped reading ends in sendTimeout, and the torn connection ends")
    func asyncSendTimeout() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("asynctimeout")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.kill() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        kill(peer.pid, SIGSTOP)
        defer { kill(peer.pid, SIGCONT) }
        // The rest of each frame goes to the kernel whole (the loop's transfer ring), unless
        // IPCBENCH_LARGE_TRANSFERS=epoll: the deadline ends it either way.
        let big = [UInt8](repeating: 7, count: 1 << 20)
        await expectIPCError(.sendTimeout) {
            for _ in 0..<64 {
                try await connection.send(big, msgid: 9, timeout: .milliseconds(300))
            }
        }
        let deadline = ContinuousClock.now + .seconds(30)
        while connection.invalidationReason == nil, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(connection.invalidationReason?.kind == .transportFailure, "\(String(describing: connection.invalidationReason))")
        #expect(connection.invalidationReason?.error?.code == .sendTimeout, "\(String(describing: connection.invalidationReason))")
    }

    @Test("large requests and replies, eight in flight at once, both framings, arrive whole and each to its requester", arguments: Framing.allCases)
    func largeRequestsInFlightTogether(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("large")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: framing).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        // Each frame's rest, both ways, is the kernel's to move while the others queue behind it.
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for index in 0..<8 {
                tasks.addTask {
                    let size = (1 << 20) + index * 4099
                    let payload = periodicBytes(size, step: 7, offset: index)
                    for _ in 0..<3 {
                        let reply = try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(60))
                        #expect(reply == payload, "request \(index)")
                    }
                }
            }
            try await tasks.waitForAll()
        }
        #expect(connection.invalidationReason == nil)
    }

    @Test("a failing handler is reported to the requester")
    func handlerFailure() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("fail")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .http, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: .http).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        await expectIPCError(.transportFailure) {
            try await connection.request([1], msgid: PeerRequest.fail, sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
        }
        let reply = try await connection.request([4, 2], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
        #expect(reply == [4, 2])
    }

    @Test("a payload above the maximum is refused before it is sent")
    func payloadTooLarge() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("toolarge")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = 1024 })
        defer { connection.invalidate() }
        await expectIPCError(.payloadTooLarge) { try connection.send([UInt8](repeating: 0, count: 1025), msgid: 1, timeout: .seconds(5)) }
        let reply = try await connection.request([9], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(30))
        #expect(reply == [9])
    }
}
