@testable import FilePresenterTransport
@testable import IPCFileCoordination
import Foundation
import IPCBenchKit
import IPCCore
import IPCSystem
import IPCTestSupport
@testable import MessagePortTransport
import NotifyTransport
import SystemPackage
import Testing
import IPCConformance
import IPCEngine
import IPCFraming

/// Garbage written by another process (`ipcbench hostile write|queue`) into the shared objects
/// of a live connection: the victim connection ends with a typed protocol error, nothing
/// crashes, and a well-behaved client process of the same listener keeps being served.
@Suite("Hostile peers: store-based transports", .serialized, .usesMessageQueues)
struct StoreHostileTests {
    static let maximumPayloadLength = 1 << 20

    static func binaryHeader(magic: UInt8 = 0x49, length: UInt32) -> [UInt8] {
        [magic, 0x50, 1, 1, 0, 0, 0, 7] + [UInt8](repeating: 0, count: 8) + withUnsafeBytes(of: length.bigEndian, Array.init)
    }

    static func littleEndian(_ value: UInt64) -> [UInt8] { withUnsafeBytes(of: value.littleEndian, Array.init) }

    // MARK: Notify rings

    struct RingGarbage: Sendable, CustomTestStringConvertible {
        var name: String
        /// Bytes written at the start of the client-to-server ring's data.
        var data: [UInt8]
        /// The write index then published (the read index is 0).
        var writeIndex: UInt64
        /// Both indexes of the server-to-client ring instead, after which the server sends to
        /// the victim (a server that added to a forged index trapped on the overflow).
        var serverToClientIndexes: UInt64? = nil
        var code: IPCError.Code
        var testDescription: String { name }
    }

    static let ringGarbage: [RingGarbage] = [
        RingGarbage(name: "garbage magic", data: binaryHeader(magic: 0x00, length: 0), writeIndex: 20, code: .malformedFrame),
        RingGarbage(name: "a frame announcing 4 GiB", data: binaryHeader(length: .max), writeIndex: 20, code: .frameTooLarge),
        RingGarbage(name: "a write index past the ring's capacity", data: [], writeIndex: 1 << 40, code: .malformedFrame),
        RingGarbage(name: "a write index of 2^64 - 1", data: [], writeIndex: .max, code: .malformedFrame),
        RingGarbage(name: "both indexes of the server's ring at 2^64 - 16", data: [], writeIndex: 0, serverToClientIndexes: .max - 15, code: .malformedFrame),
    ]

    @Test("garbage in a notify ring ends only that connection", arguments: ringGarbage)
    func notifyRing(_ garbage: RingGarbage) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("ring")
        let listener = try NotifyTransport().listen(at: endpoint, options: .defaults { $0.maximumPayloadLength = Self.maximumPayloadLength }, acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client) }
        defer { good.stop() }
        let goodConnection = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let loop = RoundTripLoop(goodConnection, msgid: PeerRequest.echo)
        // The victim's client is in this process, its store named for this test.
        let label = NotifyStores.uniqueLabel()
        let victimClient = try await NotifyTransport(storeLabel: label).connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = Self.maximumPayloadLength })
        defer { victimClient.invalidate() }
        let victimConnection = try await nextConnection(from: listener.connections, peer: getpid(), "the victim")
        let probe = InvalidationProbe()
        probe.attach(to: victimConnection)
        // Both ends of the victim's connection map the same store here: either path reaches it.
        let store = try #require(NotifyStores.paths(of: getpid(), label: label).first, "no store for the victim")

        if let index = garbage.serverToClientIndexes {
            // Server-to-client ring: header at 128 (write index, read index). The server's next
            // send would add to the forged write index.
            try HostilePeer.write(into: store, [(128, Self.littleEndian(index) + Self.littleEndian(index))])
            await expectIPCError(garbage.code) { try victimConnection.send([UInt8](repeating: 7, count: 64), msgid: 1, timeout: .seconds(5)) }
        } else {
            // Client-to-server ring: header at 64 (write index, read index), data at 4096. No
            // bell is rung: the victim's next message rings it, or the periodic check finds it.
            try HostilePeer.write(into: store, [(4096, garbage.data), (64, Self.littleEndian(garbage.writeIndex))])
            try? await victimClient.send([1], msgid: 1, timeout: .seconds(5))
        }
        #expect(await probe.wait(seconds: 30), "the victim's connection was not invalidated")
        #expect(probe.reason?.kind == .protocolError, "invalidated with \(String(describing: probe.reason))")
        #expect(probe.reason?.error?.code == garbage.code, "invalidated with \(String(describing: probe.reason))")
        await loop.stop()
        #expect(goodConnection.invalidationReason == nil)
    }

    @Test("a notify store overwritten with random bytes and no post ends that connection with a typed error within seconds")
    func notifyStoreOverwritten() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("scribble")
        let server = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let good = try await NotifyTransport().connect(to: endpoint, options: .defaults)
        defer { good.invalidate() }
        let loop = RoundTripLoop(good, msgid: PeerRequest.echo)
        let label = NotifyStores.uniqueLabel()
        let victim = try await NotifyTransport(storeLabel: label).connect(to: endpoint, options: .defaults)
        defer { victim.invalidate() }
        let probe = InvalidationProbe()
        probe.attach(to: victim)
        #expect(try await victim.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        let path = try #require(NotifyStores.paths(of: getpid(), label: label).first, "no store for the victim")
        // Header, flags and indexes, without ringing anyone: both ends wait on their doorbells.
        var random = SystemRandomNumberGenerator()
        var garbage = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &random) }
        garbage[0] = ~0x59  // never the magic's first byte
        try HostilePeer.write(into: path, [(0, garbage)])
        #expect(await probe.wait(seconds: 30), "the victim was not invalidated")
        #expect(probe.reason?.kind == .protocolError, "\(String(describing: probe.reason))")
        #expect(probe.reason?.error?.code == .malformedFrame, "\(String(describing: probe.reason))")
        await loop.stop()
        #expect(good.invalidationReason == nil)
        #expect(try await good.request([2], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [2])
    }

    /// A listener's options for the stall tests: a stalled frame is dropped after a second.
    static let stallingOptions = ConnectionOptions.defaults {
        $0.maximumPayloadLength = Self.maximumPayloadLength
        $0.stalledFrameTimeout = .seconds(1)
    }

    /// Expects the connection `probe` watches to end as a stalled one does: a protocol error,
    /// `truncatedFrame` (within a generous deadline: the timeout is a second).
    static func expectDroppedForStalling(_ probe: InvalidationProbe) async {
        #expect(await probe.wait(seconds: 30), "the stalled connection was not dropped")
        #expect(probe.reason?.kind == .protocolError, "invalidated with \(String(describing: probe.reason))")
        #expect(probe.reason?.error?.code == .truncatedFrame, "invalidated with \(String(describing: probe.reason))")
    }

    @Test("part of a frame in a notify ring and then nothing: the listener drops that connection with truncatedFrame after its stalled-frame timeout, and serves others")
    func notifyStalledFrame() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("stall")
        let listener = try NotifyTransport().listen(at: endpoint, options: Self.stallingOptions, acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client) }
        defer { good.stop() }
        let goodConnection = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let loop = RoundTripLoop(goodConnection, msgid: PeerRequest.echo)
        let label = NotifyStores.uniqueLabel()
        let victimClient = try await NotifyTransport(storeLabel: label).connect(to: endpoint, options: .defaults)
        defer { victimClient.invalidate() }
        let victimConnection = try await nextConnection(from: listener.connections, peer: getpid(), "the victim")
        let probe = InvalidationProbe()
        probe.attach(to: victimConnection)
        let store = try #require(NotifyStores.paths(of: getpid(), label: label).first, "no store for the victim")
        // The client-to-server ring is empty (nothing sent yet): a header announcing 1,000 bytes
        // and 10 of them, published at the start of its data. The victim's next message, which
        // rings the bell, lands behind them and becomes more of that payload: the server then
        // holds 51 of the 1,020 bytes announced, and nothing more comes.
        try HostilePeer.write(into: store, [(4096, Self.binaryHeader(length: 1000) + [UInt8](repeating: 7, count: 10)), (64, Self.littleEndian(30))])
        try await victimClient.send([1], msgid: 1, timeout: .seconds(5))
        await Self.expectDroppedForStalling(probe)
        await loop.stop()
        #expect(goodConnection.invalidationReason == nil)
    }

    // MARK: Message port queues

    /// One hostile queue message to the server's queue, in hex, made from fragment header fields.
    static func fragment(magic: UInt8 = 0x4D, kind: UInt8 = 1, sender: UInt32, total: UInt32, offset: UInt32, body: [UInt8] = []) -> String {
        var bytes: [UInt8] = [magic, 0x50, 1, kind, 0, 0, 0, 9] + [UInt8](repeating: 0, count: 8)
        for field in [sender, total, offset] { bytes += withUnsafeBytes(of: field.bigEndian, Array.init) }
        return HostilePeer.hex(bytes + body)
    }

    /// A hello (kind 16) to the server's queue, in hex: the pid, then the reply queue's name.
    static func hello(pid: Int32 = getpid(), replyQueue: String) -> String {
        let body = withUnsafeBytes(of: UInt32(bitPattern: pid).bigEndian, Array.init) + Array(replyQueue.utf8)
        return fragment(kind: 16, sender: 0, total: UInt32(body.count), offset: 0, body: body)
    }

    /// Cuts the file at `path` to `length` bytes from another process (`truncate(1)`), waited
    /// for off the cooperative pool; returns its exit status.
    static func truncate(_ path: String, to length: Int) async throws -> Int32 {
        try await runBlocking {
            let truncate = Process()
            truncate.executableURL = URL(fileURLWithPath: "/usr/bin/truncate")
            truncate.arguments = ["--size", String(length), path]
            try truncate.run()
            truncate.waitUntilExit()
            return truncate.terminationStatus
        }
    }

    /// Stops a message port client process and removes its reply queue if the listener, closed
    /// right after, had no time to see it exit (queues outlive processes and count against the
    /// user's queue memory).
    static func stop(_ client: PeerProcess, _ endpoint: Endpoint) {
        client.stop()
        MessageQueue.unlink(name: PortNames.replyQueue(endpoint, pid: client.pid, serial: 1))
    }

    @Test("garbage in a message port's queue: unparseable messages are dropped, a client's broken fragments end only that client")
    func messagePortQueue() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("port")
        let listener = try MessagePortTransport().listen(at: endpoint, options: .defaults { $0.maximumPayloadLength = Self.maximumPayloadLength }, acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
        defer { Self.stop(good, endpoint) }
        _ = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let goodConnection = try #require(listener.activeConnections.first)
        let loop = RoundTripLoop(goodConnection, msgid: PeerRequest.echo)
        let queue = PortNames.serverQueue(endpoint)

        // Messages that name no client, or do not parse (in the good client's name): dropped,
        // nobody is hurt.
        let goodID = try #require(listener.clientID(of: goodConnection))
        let status = try HostilePeer.run(["queue", "--name", queue,
            "--hex", "00", "--hex", HostilePeer.hex([UInt8](repeating: 0xFF, count: 100)),
            "--hex", Self.fragment(magic: 0, sender: goodID, total: 0, offset: 0),
            "--hex", Self.fragment(kind: 99, sender: goodID, total: 0, offset: 0),
            "--hex", Self.fragment(sender: goodID &+ 1, total: 10, offset: 0, body: [1]),
            "--hex", Self.fragment(sender: goodID, total: 4, offset: 2, body: [1, 2, 3]),  // overruns its message: does not parse
            "--hex", Self.fragment(kind: 16, sender: 0, total: 4, offset: 0, body: [0, 0, 0, 1]),  // a hello with no queue
        ])
        #expect(status == 0)

        // Fragments in the name of a live client (its id, which the listener drew at random):
        // that client's connection ends with a protocol error.
        for (name, hostile, code) in [
            ("a message above the maximum", { Self.fragment(sender: $0, total: UInt32.max, offset: 0, body: [1]) }, IPCError.Code.frameTooLarge),
            ("a continuation with no message in progress", { Self.fragment(sender: $0, total: 100, offset: 50, body: [1]) }, .malformedFrame),
        ] as [(String, (UInt32) -> String, IPCError.Code)] {
            let victim = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
            defer { Self.stop(victim, endpoint) }
            let victimConnection = try await nextConnection(from: listener.connections, peer: victim.pid, "the victim")
            let hostile = hostile(try #require(listener.clientID(of: victimConnection)))
            let probe = InvalidationProbe()
            probe.attach(to: victimConnection)
            #expect(try HostilePeer.run(["queue", "--name", queue, "--hex", hostile]) == 0)
            #expect(await probe.wait(seconds: 30), "\(name): the victim was not invalidated")
            #expect(probe.reason?.kind == .protocolError, "\(name): \(String(describing: probe.reason))")
            #expect(probe.reason?.error?.code == code, "\(name): \(String(describing: probe.reason))")
            // The victim is told (a goodbye), and its process, whose connection has ended, exits.
            let exitBy = ContinuousClock.now + .seconds(30)
            while victim.isRunning, ContinuousClock.now < exitBy { try await Task.sleep(for: .milliseconds(20)) }
            #expect(!victim.isRunning, "\(name): the victim was not told that its connection ended")
        }
        await loop.stop()
        #expect(goodConnection.invalidationReason == nil)
    }

    @Test("a message port message whose first fragment came and no other: the listener drops that client with truncatedFrame after its stalled-frame timeout, and serves others")
    func messagePortStalledMessage() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("stall")
        let listener = try MessagePortTransport().listen(at: endpoint, options: Self.stallingOptions, acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
        defer { Self.stop(good, endpoint) }
        _ = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let goodConnection = try #require(listener.activeConnections.first)
        let loop = RoundTripLoop(goodConnection, msgid: PeerRequest.echo)
        // The listener's second client.
        let victim = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
        defer { Self.stop(victim, endpoint) }
        let victimConnection = try await nextConnection(from: listener.connections, peer: victim.pid, "the victim")
        let probe = InvalidationProbe()
        probe.attach(to: victimConnection)
        // The first fragment of a 1,000-byte message in the victim's name, and nothing after it.
        let first = Self.fragment(sender: try #require(listener.clientID(of: victimConnection)), total: 1000, offset: 0, body: [UInt8](repeating: 7, count: 10))
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint), "--hex", first]) == 0)
        await Self.expectDroppedForStalling(probe)
        await loop.stop()
        #expect(goodConnection.invalidationReason == nil)
    }

    @Test("four message-port clients whose first fragments announce 1 GiB - 1 each: the server reserves nothing for what is only announced")
    func messagePortAnnouncedLengths() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("announce")
        // The peer server allows payloads up to 1 GiB, so each announcement is admissible.
        let server = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        // Four clients: each holds a reply queue, and this user's queue memory (RLIMIT_MSGQUEUE,
        // 800 KiB by default, raised only with CAP_SYS_RESOURCE) holds about ten, which other
        // tests running meanwhile need too. Reserving what is announced would cost 1 GiB of
        // address space per client; 40 clients as in issue 35 do not fit one user's quota.
        let transport = MessagePortTransport()
        var clients: [MessagePortConnection] = []
        defer { clients.forEach { $0.invalidate() } }
        for _ in 0..<4 {
            let client = try await transport.connect(to: endpoint, options: .defaults, retrying: ConnectRetry(for: .seconds(30)))
            #expect(try await client.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
            clients.append(client)
        }
        let before = try memoryUsage(of: server.pid)
        // One first fragment in each client's name (the id the server drew for it), announcing
        // 1 GiB - 1 and carrying one byte.
        let announced = UInt32((1 << 30) - 1)
        let senders = try clients.map { try #require($0.messagePortSenderID) }
        var arguments = ["queue", "--name", PortNames.serverQueue(endpoint)]
        for sender in senders { arguments += ["--hex", Self.fragment(sender: sender, total: announced, offset: 0, body: [1])] }
        #expect(try HostilePeer.run(arguments) == 0)
        // Half a second for the server to read them (its queue is read on its event loop).
        try await Task.sleep(for: .milliseconds(500))
        let after = try memoryUsage(of: server.pid)
        let grown = after.virtual - before.virtual
        print("\(clients.count) announcements of 1 GiB - 1: the server's virtual memory grew by \(grown >> 20) MiB, resident by \((after.resident - before.resident) >> 20) MiB")
        // Reserving what is announced would be a GiB of address space per client.
        #expect(grown < 1 << 30, "virtual memory grew by \(grown >> 20) MiB for \(clients.count) announcements")
        #expect(server.isRunning)
        // The announcements were taken as the clients' own (not dropped as naming nobody): a
        // continuation at offset 1 in the first client's name continues its message (its
        // connection goes on); one at offset 5 in the second's does not, and ends that connection.
        let continued = InvalidationProbe()
        continued.attach(to: clients[0])
        let broken = InvalidationProbe()
        broken.attach(to: clients[1])
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint),
            "--hex", Self.fragment(sender: senders[0], total: announced, offset: 1, body: [2]),
            "--hex", Self.fragment(sender: senders[1], total: announced, offset: 5, body: [2])]) == 0)
        #expect(await broken.wait(seconds: 30), "a broken continuation in the second client's name did not end its connection")
        #expect(broken.reason?.kind == .protocolError || broken.reason?.kind == .peerClosed, "\(String(describing: broken.reason))")
        try await Task.sleep(for: .milliseconds(300))
        #expect(clients[0].invalidationReason == nil, "a continuation of the first client's announced message ended its connection: the announcement was not taken as its own")
    }

    @Test("one process's hellos are admitted up to the per-process bound; the next is not answered")
    func messagePortHellosPerProcess() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("many")
        let listener = try MessagePortTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        // This process makes the queues and holds them (as a client would); another process
        // sends the hellos in its name.
        let bound = MessagePortListener.maximumClientsPerProcess
        let names = (1...(bound + 4)).map { PortNames.replyQueue(endpoint, pid: getpid(), serial: 10_000 + $0) }
        let queues = try names.map { try MessageQueue.create(name: $0, maximumMessages: 1, messageSize: PortFragmentHeader.minimumQueueMessageSize) }
        defer {
            queues.forEach { $0.close() }
            names.forEach { MessageQueue.unlink(name: $0) }
        }
        let hellos = names.map { Self.hello(replyQueue: $0) }
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint)] + hellos.flatMap { ["--hex", $0] }) == 0)
        let deadline = ContinuousClock.now + .seconds(30)
        while listener.activeConnections.count < bound, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        try await Task.sleep(for: .milliseconds(300))
        #expect(listener.activeConnections.count == bound)
    }

    @Test("a hello that claims another client's reply queue, a pid that is not its queue's, or a process that does not hold the queue, is refused")
    func messagePortForgedHello() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("hello")
        let listener = try MessagePortTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
        defer { Self.stop(good, endpoint) }
        _ = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let goodConnection = try #require(listener.activeConnections.first)
        let goodQueue = PortNames.replyQueue(endpoint, pid: good.pid, serial: 1)
        // Queues this process (the attacker) makes in others' names: one for pid 1, one for the
        // good client. Each names a live process of this user (the tests run as root) that does
        // not hold it.
        let claimed = [PortNames.replyQueue(endpoint, pid: 1, serial: 1), PortNames.replyQueue(endpoint, pid: good.pid, serial: 7)]
        for name in claimed { try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64).close() }
        defer { for name in claimed { MessageQueue.unlink(name: name) } }
        let forged = [
            Self.hello(pid: good.pid, replyQueue: goodQueue),  // the live client's own queue, again
            Self.hello(pid: 1, replyQueue: goodQueue),  // a queue named for another pid
            Self.hello(pid: 1, replyQueue: claimed[0]),  // pid 1, which does not hold it
            Self.hello(pid: good.pid, replyQueue: claimed[1]),  // the good client, which does not hold it
        ]
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint)] + forged.flatMap { ["--hex", $0] }) == 0)
        // A hello the listener takes is answered at once; give it time to answer, then check
        // that no connection was admitted and the good client is still served.
        #expect(try await goodConnection.request([4], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [4])
        try await Task.sleep(for: .milliseconds(500))
        #expect(listener.activeConnections.count == 1)
        #expect(try await goodConnection.request([5], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [5])
    }

    @Test("a hello whose reply queue is too small for a fragment with payload is not answered (a server crashed on its client's first request: no room in a fragment of 28 bytes), and the server serves others")
    func messagePortTinyReplyQueue() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("tiny")
        let server = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        // This process makes and holds the queues, as a client would; another sends the hellos.
        let sizes = [28, 29, 100, PortFragmentHeader.minimumQueueMessageSize - 1]
        let names = sizes.map { PortNames.replyQueue(endpoint, pid: getpid(), serial: 20_000 + $0) }
        let queues = try zip(names, sizes).map { try MessageQueue.create(name: $0, maximumMessages: 2, messageSize: $1) }
        defer {
            queues.forEach { $0.close() }
            names.forEach { MessageQueue.unlink(name: $0) }
        }
        let hellos = names.map { Self.hello(replyQueue: $0) }
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint)] + hellos.flatMap { ["--hex", $0] }) == 0)
        // A request in the ids a counting server would have given them.
        let requests = (1...4).map { Self.fragment(kind: 2, sender: UInt32($0), total: 1, offset: 0, body: [9]) }
        #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint)] + requests.flatMap { ["--hex", $0] }) == 0)
        try await Task.sleep(for: .seconds(1))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: PortFragmentHeader.minimumQueueMessageSize, alignment: 8)
        defer { buffer.deallocate() }
        for (queue, size) in zip(queues, sizes) {
            #expect(try queue.receive(into: buffer, deadline: .after(.zero)) == nil, "a reply queue of \(size) bytes was answered")
        }
        #expect(server.isRunning)
        let client = try await MessagePortTransport().connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        #expect(try await client.request([3], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [3])
    }

    @Test("a client that finds, under the port's name, a queue too small for a fragment with payload fails with invalidEndpoint (it crashed on a queue of 1 byte, and sent header-only fragments into one of 28 until its timeout)")
    func messagePortTinyServerQueue() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("squat")
        // The endpoint's lock held by a live process (this one), and another process's queue
        // under the port's name, as in the moment before a listener takes its name back.
        let claim = try ClaimedEndpoint(endpoint)
        defer { claim.close {} }
        for size in [1, 28, PortFragmentHeader.minimumQueueMessageSize - 1] {
            let impostor = try MessageQueue.create(name: PortNames.serverQueue(endpoint), maximumMessages: 4, messageSize: size)
            defer {
                impostor.close()
                MessageQueue.unlink(name: PortNames.serverQueue(endpoint))
            }
            let error = await #expect(throws: IPCError.self, "a queue of \(size) bytes") {
                let connection = try await MessagePortTransport(connectTimeout: .seconds(3)).connect(to: endpoint, options: .defaults)
                connection.invalidate()
            }
            #expect(error?.code == .invalidEndpoint, "a queue of \(size) bytes: \(String(describing: error))")
            #expect(try impostor.messageCount() == 0, "a client wrote into a queue of \(size) bytes")
        }
    }

    @Test("a goodbye forged in a client's name ends its connection on both sides: the server answers it with its own (the client went on waiting on a connection the server had dropped); client ids are drawn at random")
    func messagePortForgedGoodbye() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("bye")
        let listener = try MessagePortTransport().listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        var ids: [UInt32] = []
        for round in 0..<2 {
            let victim = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
            defer { Self.stop(victim, endpoint) }
            let connection = try await nextConnection(from: listener.connections, peer: victim.pid, "client \(round + 1)")
            let id = try #require(listener.clientID(of: connection))
            ids.append(id)
            #expect(try HostilePeer.run(["queue", "--name", PortNames.serverQueue(endpoint), "--hex", Self.fragment(kind: 18, sender: id, total: 0, offset: 0)]) == 0)
            // The client peer exits once its connection has ended.
            let exitBy = ContinuousClock.now + .seconds(30)
            while victim.isRunning, ContinuousClock.now < exitBy { try await Task.sleep(for: .milliseconds(20)) }
            #expect(!victim.isRunning, "client \(round + 1) was not told that the server ended its connection")
        }
        #expect(ids != [1, 2], "client ids are counted, so another process can name a live client")
    }

    // MARK: File presenter journals

    @Test("truncating a client's journal under its mappings kills nobody: that connection ends with a typed error, the listener serves others")
    func filePresenterJournalTruncated() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("shrunk")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let good = try await transport.connect(to: endpoint, options: .defaults)
        defer { good.invalidate() }
        let loop = RoundTripLoop(good, msgid: PeerRequest.echo)
        let journalsBefore = Set(try FileManager.default.contentsOfDirectory(atPath: group.directory.path).filter { $0.hasSuffix(".journal") })
        let victim = try await transport.connect(to: endpoint, options: .defaults)
        defer { victim.invalidate() }
        let probe = InvalidationProbe()
        probe.attach(to: victim)
        #expect(try await victim.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        let journal = try #require(Set(try FileManager.default.contentsOfDirectory(atPath: group.directory.path).filter { $0.hasSuffix(".journal") }).subtracting(journalsBefore).first)
        // Another process cuts the file to nothing: both the victim (its reader) and the server
        // (its writer) map its header.
        #expect(try await Self.truncate(group.directory.path + "/" + journal, to: 0) == 0)
        // The server's next reply to the victim meets the truncated header.
        _ = try? await victim.request([2], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
        #expect(await probe.wait(seconds: 30), "the victim was not invalidated")
        #expect(server.isRunning, "the server died")
        await loop.stop()
        #expect(good.invalidationReason == nil)
        #expect(try await good.request([3], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [3])
    }

    @Test("cutting a client's outbox to every interesting length while it streams kills nobody: the server reads on or ends that connection with a typed error, and serves others")
    func filePresenterOutboxCutWhileStreaming() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("cut")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let good = try await transport.connect(to: endpoint, options: .defaults)
        defer { good.invalidate() }
        let loop = RoundTripLoop(good, msgid: PeerRequest.echo)
        // 0 bytes, the header only, half of what the file holds, and one byte short of it: each
        // cut from another process while the victim appends and the server reads (and maps) it.
        for (round, cut) in ["0", "24", "half", "short"].enumerated() {
            let victim = try await transport.connect(to: endpoint, options: .defaults)
            defer { victim.invalidate() }
            let outbox = try #require(victim.outboxPath)
            // Streams for 300 ms (the cut comes 50 ms in), or until a send fails.
            let streaming = Task { () -> Int in
                let until = ContinuousClock.now + .milliseconds(300)
                var sent = 0
                while ContinuousClock.now < until {
                    guard (try? await victim.send([UInt8](repeating: UInt8(truncatingIfNeeded: sent), count: 512), msgid: UInt32(sent), timeout: .seconds(5))) != nil else { break }
                    sent += 1
                }
                return sent
            }
            try await Task.sleep(for: .milliseconds(50))
            let size = (try FileManager.default.attributesOfItem(atPath: outbox)[.size] as? Int) ?? 0
            let length = ["0": 0, "24": 24, "half": size / 2, "short": max(size - 1, 0)][cut]!
            #expect(try await Self.truncate(outbox, to: length) == 0)
            let sent = await streaming.value
            // Either the connection goes on or it ended with a typed reason; never the server.
            _ = try? await victim.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(5), receiveTimeout: .seconds(5))
            print("outbox cut to \(cut) (\(length) of \(size) bytes) after \(sent) sends in 300 ms: the victim \(victim.invalidationReason.map { "ended: \($0)" } ?? "goes on")")
            #expect(server.isRunning, "round \(round) (\(cut)): the server died")
            #expect(try await good.request([UInt8(round)], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [UInt8(round)], "round \(round) (\(cut))")
        }
        await loop.stop()
        #expect(good.invalidationReason == nil)
    }

    @Test("hellos on the rendezvous socket that claim another process's pid, are garbage, or never finish are refused; the listener serves others")
    func filePresenterForgedHello() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("forged")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let good = try await transport.connect(to: endpoint, options: .defaults)
        defer { good.invalidate() }
        let loop = RoundTripLoop(good, msgid: PeerRequest.echo)
        // The good client's journal is <name>.<pid>-<serial>.journal: a hello naming it, from
        // another process, claims this process's identity and its connection.
        let journal = try #require(good.journalPath)
        let identity = try #require(journal.split(separator: ".").dropLast().last)
        let parts = identity.split(separator: "-").compactMap { UInt32($0) }
        try #require(parts.count == 2)
        func hello(pid: UInt32, serial: UInt32, magic: UInt32 = 0x4950_4648) -> [UInt8] {
            // Version 3, the listener's: what is refused is the claim, not the version.
            [magic, 3, pid, serial].flatMap { withUnsafeBytes(of: $0.bigEndian, Array.init) }
        }
        for (name, bytes) in [
            ("another process's pid and live journal", hello(pid: parts[0], serial: parts[1])),
            ("pid 1", hello(pid: 1, serial: 1)),
            ("bad magic", hello(pid: parts[0], serial: parts[1], magic: 0x4950_464A)),
            ("half a hello, then nothing", Array(hello(pid: 1, serial: 1).prefix(7))),
        ] {
            let hostile = try await HostilePeer.socket(path: endpoint.path(suffix: ".rendezvous"), bytes: bytes)
            try await expectDropped(hostile, name)
        }
        #expect(server.isRunning)
        await loop.stop()
        #expect(good.invalidationReason == nil)
        #expect(try await good.request([4], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [4])
    }

    @Test("garbage committed into a client's outbox: the listener ends that connection and tells its client, so it does not wait; the other client is served")
    func filePresenterOutboxGarbage() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("outbox")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let clients = try (0..<2).map { _ in try transport.connect(to: endpoint, options: .defaults) }
        defer { clients.forEach { $0.invalidate() } }
        let probes = clients.map { client in
            let probe = InvalidationProbe()
            probe.attach(to: client)
            return probe
        }
        for client in clients {
            #expect(try await client.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        }
        // A record with bad magic, committed at the end of the first client's outbox by another process.
        let path = try #require(clients[0].outboxPath)
        let header = try #require(FileHandle(forReadingAtPath: path)).readData(ofLength: 24)
        let end = header[16..<24].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let garbage: [UInt8] = [0x00, 0x00, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]
        try HostilePeer.write(into: path, [(Int(end), garbage), (16, withUnsafeBytes(of: (end + UInt64(garbage.count)).bigEndian, Array.init))])
        // The write through another description makes the inotify event that wakes the listener.
        #expect(await probes[0].wait(seconds: 30), "the client was not told that the listener ended its connection")
        #expect(probes[0].reason?.kind == .peerClosed, "\(String(describing: probes[0].reason))")
        #expect(try await clients[1].request([2], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [2])
        #expect(clients[1].invalidationReason == nil)
        #expect(server.isRunning)
    }

    @Test("a committed end far past the end of a client's outbox: the listener allocates nothing for it (it allocated the announced bytes first, 4 GiB for an end a client may set), ends that connection with truncatedFrame, and serves others")
    func filePresenterOutboxEndPastFile() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("far")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let clients = try (0..<2).map { _ in try transport.connect(to: endpoint, options: .defaults) }
        defer { clients.forEach { $0.invalidate() } }
        for client in clients {
            #expect(try await client.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        }
        let before = try memoryUsage(of: server.pid)
        // 512 MiB committed past the records read, within the capacity (16 MiB) and one frame of
        // the peer's maximum (1 GiB) that a reader allows, in a file of a few KiB.
        let path = try #require(clients[0].outboxPath)
        let header = try #require(FileHandle(forReadingAtPath: path)).readData(ofLength: 24)
        let end = header[16..<24].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        try HostilePeer.write(into: path, [(16, withUnsafeBytes(of: (end + (512 << 20)).bigEndian, Array.init)), (7, [0])])
        let probe = InvalidationProbe()
        probe.attach(to: clients[0])
        #expect(await probe.wait(seconds: 30), "the client was not told that the listener ended its connection")
        #expect(try await clients[1].request([2], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [2])
        let after = try memoryUsage(of: server.pid)
        #expect(after.peakResident - before.peakResident < 64 << 20, "the listener's peak resident memory grew by \((after.peakResident - before.peakResident) >> 20) MiB")
        #expect(server.isRunning)
    }

    @Test("a client whose files declare a capacity above the listener's journals' is not admitted: what a connection's reader may have to hold follows from it")
    func filePresenterCapacityAboveListener() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("large")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let large = FilePresenterTransport(journalCapacity: FilePresenterTransport().journalCapacity * 2, connectTimeout: .seconds(3))
        await #expect(throws: IPCError.self) {
            let connection = try await large.connect(to: endpoint, options: .defaults)
            connection.invalidate()
        }
        let client = try await FilePresenterTransport().connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        #expect(try await client.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
    }

    @Test("a second hello naming a live client's sender is refused and leaves that client's connection served (the refused hello's watch of the outbox was the live connection's, and dropping it stopped its reads)")
    func filePresenterDuplicateHello() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("twice")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let client = try await FilePresenterTransport().connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        #expect(try await client.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        // The same process (the only one whose pid the listener takes) says hello again as that sender.
        let outbox = try #require(client.outboxPath)
        let sender = try #require(JournalNames.sender(ofClientFile: String(outbox.split(separator: "/").last!), endpoint: endpoint))
        let socket = try UnixSocket.connect(path: RendezvousHello.socketPath(endpoint))
        defer { try? socket.close() }
        let hello = RendezvousHello.bytes(sender)
        #expect(hello.withUnsafeBytes { send(socket.rawValue, $0.baseAddress, $0.count, 0) } == hello.count)
        var answer = [UInt8](repeating: 0, count: 4)
        #expect(answer.withUnsafeMutableBytes { recv(socket.rawValue, $0.baseAddress, 4, CInt(MSG_WAITALL)) } == 4)
        #expect(answer == [3, 0, 0, 0], "the second hello was answered \(answer)")
        for value in UInt8(2)...5 {
            #expect(try await client.request([value], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [value])
        }
    }

    @Test("garbage committed into a client's journal ends that client's connection; the listener serves others")
    func filePresenterJournal() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("journal")
        let server = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let transport = FilePresenterTransport()
        let good = try await transport.connect(to: endpoint, options: .defaults)
        defer { good.invalidate() }
        let loop = RoundTripLoop(good, msgid: PeerRequest.echo)
        for (name, record, code) in [
            ("a record with bad magic", [0x00, 0x00, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0] as [UInt8], IPCError.Code.malformedFrame),
            ("a record of unknown kind", [0x46, 0x52, 9, 0, 0, 0, 0, 1, 0, 0, 0, 0], .malformedFrame),
            // The committed end says the frame is whole, and it is not.
            ("a frame announcing 4 GiB that runs past the committed end", [0x46, 0x52, 1, 0] + withUnsafeBytes(of: UInt32(bitPattern: server.pid).bigEndian, Array.init) + [0, 0, 0, 0] + Self.binaryHeader(length: .max), .truncatedFrame),
        ] {
            let journals = { try Set(FileManager.default.contentsOfDirectory(atPath: group.directory.path).filter { $0.hasSuffix(".journal") }) }
            let before = try journals()
            let victim = try await transport.connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = Self.maximumPayloadLength })
            defer { victim.invalidate() }
            let probe = InvalidationProbe()
            probe.attach(to: victim)
            #expect(try await victim.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
            // The victim's journal is the one its connect made (names carry a serial, whose
            // digits do not sort).
            let made = try journals().subtracting(before)
            try #require(made.count == 1, "\(name): the victim's connect made \(made.sorted()) journals")
            let path = group.directory.path + "/" + made.first!
            // The committed end (offset 16, big-endian), then the record written there and committed.
            let header = try #require(FileHandle(forReadingAtPath: path)).readData(ofLength: 24)
            let end = header[16..<24].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            try HostilePeer.write(into: path, [(Int(end), record), (16, withUnsafeBytes(of: (end + UInt64(record.count)).bigEndian, Array.init))])
            #expect(await probe.wait(seconds: 30), "\(name): the victim was not invalidated")
            #expect(probe.reason?.kind == .protocolError, "\(name): \(String(describing: probe.reason))")
            #expect(probe.reason?.error?.code == code, "\(name): \(String(describing: probe.reason))")
        }
        await loop.stop()
        #expect(good.invalidationReason == nil)
    }
}
