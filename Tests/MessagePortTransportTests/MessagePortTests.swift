import CIPCShims
import Foundation
import IPCBenchKit
import IPCCore
import IPCSystem
import IPCTestSupport
@testable import MessagePortTransport
import Synchronization
import Testing
import IPCConformance
import IPCEngine
import IPCFraming

/// Message ports against real peer processes (`ipcbench peer --transport message-port`).
/// Serialized: every queue counts against the per-user queue memory (RLIMIT_MSGQUEUE, 800 KiB
/// by default, about nine default-sized queues), so tests running side by side would starve
/// each other.
@Suite("Message port", .serialized, .usesMessageQueues)
struct MessagePortTests {
    /// A generous connect timeout: the whole test run loads both cores, and a peer server's
    /// first welcome has taken over the default 5 s there (twice in some hundred runs).
    let transport = MessagePortTransport(connectTimeout: .seconds(30))

    private func startServer(_ endpoint: Endpoint) throws -> PeerProcess {
        try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .server)
    }

    private func echo(_ connection: MessagePortConnection, _ payload: [UInt8]) async throws -> [UInt8] {
        try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
    }

    @Test("payloads around the queue's message size, and up to 16 MiB, are fragmented and reassembled")
    func fragmentation() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("echo")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(connection.peer?.pid == server.pid)
        let chunk = MessageQueue.systemLimits.messageSize - PortFragmentHeader.length
        for size in [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 2 * chunk + 1, 1 << 20, 16 << 20] {
            let payload = periodicBytes(size, step: 7, offset: size)
            #expect(try await echo(connection, payload) == payload, "payload of \(size) bytes")
        }
    }

    @Test("reply queue names are drawn at random: names squatted in advance, the pid-and-counter ones a neighbour could predict, stop no connect")
    func replyQueueNamesAreUnpredictable() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("squatted")
        let server = try startServer(endpoint)
        defer { server.stop() }
        // What another user could do before: create this process's next names (serials counted
        // from 1) so that its connects fail. Small queues: every queue counts against the quota.
        let squatted = (1...4).map { PortNames.replyQueue(endpoint, pid: getpid(), serial: $0) }
        for name in squatted { _ = try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64) }
        defer { for name in squatted { MessageQueue.unlink(name: name) } }
        var serials: [UInt64] = []
        for _ in 0..<2 {
            let connection = try await transport.connect(to: endpoint, options: .defaults)
            defer { connection.invalidate() }
            #expect(try await echo(connection, [7]) == [7])
            let name = try #require(connection.replyQueueName)
            #expect(!squatted.contains(name))
            serials.append(try #require(name.split(separator: ".").last.flatMap { UInt64($0) }, "reply queue \(name)"))
        }
        // 63 random bits each: two below 2^40, or two in a row, would be a 1 in 2^22 chance.
        #expect(serials.allSatisfy { $0 >= 1 << 40 } && serials[1] != serials[0] &+ 1, "serials \(serials)")
    }

    @Test("queues that killed processes left are removed once they use up the user's queue memory: a server and a client still start")
    func abandonedQueuesAreSwept() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("swept")
        // What SIGKILLed servers leave: queues no process holds open, still counted against the
        // user's RLIMIT_MSGQUEUE, until it is used up.
        var leftovers: [String] = []
        defer { for name in leftovers { MessageQueue.unlink(name: name) } }
        let limits = MessageQueue.systemLimits
        while leftovers.count < 512 {
            let name = "/ipcb.leftover\(getpid()).\(leftovers.count)"
            let fd = ipc_mq_open(name, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600, limits.maximumMessages, limits.messageSize)
            guard fd >= 0 else { break }
            close(fd)
            leftovers.append(name)
        }
        try #require(!leftovers.isEmpty && leftovers.count < 512, "the queue memory did not run out (\(leftovers.count) queues)")
        // The server's queue, then the client's reply queue: each creation finds the quota used up.
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await echo(connection, [5]) == [5])
        #expect(leftovers.allSatisfy { !MessageQueue.exists(name: $0) }, "abandoned queues are left")
    }

    @Test("names must begin with the group identifier and a period")
    func nameScoping() async throws {
        let group = try TestGroup()
        let outside = try group.endpoint("com.example.elsewhere")
        await expectIPCError(.nameOutsideGroup) { try transport.listen(at: outside, options: .defaults, acceptFilter: nil) }
        await expectIPCError(.nameOutsideGroup) { try transport.connect(to: outside, options: .defaults) }
    }

    @Test("async connects waiting for a server that does not answer hold no thread each, and fail with the busy endpointNotFound (it runs: not gone)")
    func asyncConnectHoldsNoThread() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("silent")
        let server = try startServer(endpoint)
        defer { server.stop() }
        // Alive, its queue open, reading nothing: every hello waits for a welcome that never comes.
        defer { kill(server.pid, SIGCONT) }
        #expect(await stopProcess(server.pid), "the server was not seen stopped")
        let waiting = MessagePortTransport(connectTimeout: .seconds(3))
        let count = 8
        let before = ChildProcessTest.threadCount()
        let connects = (0..<count).map { _ in Task { try await waiting.connect(to: endpoint, options: .defaults) } }
        try await Task.sleep(for: .seconds(1))
        let during = ChildProcessTest.threadCount()
        for connect in connects {
            do {
                _ = try await connect.value
                Issue.record("a connect to a stopped server succeeded")
            } catch let error as IPCError {
                #expect(error.code == .endpointNotFound)
                #expect(error.isListenerBusy, "a connect that a running, stopped server did not answer failed with \(error), which reads as nobody listening")
                #expect(error.listenerBusyCause?.answered == false, "a stopped server's silence read as an answer: \(error)")
            }
        }
        // The synchronous connect says the same, also once the hellos left in the stopped
        // server's queue have filled it (10 messages by default).
        for _ in 0..<3 {
            do {
                _ = try await runBlocking { try MessagePortTransport(connectTimeout: .milliseconds(300)).connect(to: endpoint, options: .defaults) }
                Issue.record("a synchronous connect to a stopped server succeeded")
            } catch let error as IPCError {
                #expect(error.listenerBusyCause?.answered == false, "the synchronous connect failed with \(error)")
            }
        }
        #expect(during - before < count, "\(count) waiting connects took the process from \(before) to \(during) threads")
    }

    @Test("looking up a name nobody serves fails at once")
    func lookupUnserved() async throws {
        let group = try TestGroup()
        let start = ContinuousClock.now
        await expectIPCError(.endpointNotFound) { try transport.connect(to: try group.scopedEndpoint("nobody"), options: .defaults) }
        // "At once": no connect timeout was waited out (the timeout is 5 s).
        #expect(ContinuousClock.now - start < .seconds(4))
    }

    @Test("send timeout, receive timeout, invalid port and payload too large are distinct errors")
    func distinctErrors() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("errors")
        let server = try startServer(endpoint)
        // Stopped, not killed: its listener closes and removes its queue.
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = 1 << 20 })

        await expectIPCError(.payloadTooLarge) { try connection.send([UInt8](repeating: 0, count: (1 << 20) + 1), msgid: 1, timeout: .seconds(1)) }
        // The server never answers a stalled request: no reply (receive timeout, port still valid)...
        await expectIPCError(.receiveTimeout) {
            try await connection.request([1], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .milliseconds(300))
        }
        #expect(connection.invalidationReason == nil)
        // ...and a server that reads nothing (its process stopped) lets its queue fill, so a send
        // times out.
        defer { kill(server.pid, SIGCONT) }
        #expect(await stopProcess(server.pid), "the server was not seen stopped")
        await expectIPCError(.sendTimeout) {
            for index in 0..<100 {
                try connection.send([UInt8(index)], msgid: 5, timeout: .milliseconds(200))
            }
        }
        connection.invalidate()
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
        await expectIPCError(.invalidated) {
            try await connection.request([1], msgid: 1, sendTimeout: .seconds(1), receiveTimeout: .seconds(1))
        }
    }

    @Test("a handler that returns no data gives an empty successful reply; a failing one an error")
    func emptyReplyAndFailure() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("empty")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { msgid, _ in
            if msgid == 2 { throw IPCError(code: .unsupportedOperation, message: "no") }
            return nil
        } }, acceptFilter: nil)
        defer { listener.close() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([1, 2, 3], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [])
        await expectIPCError(.transportFailure) {
            try await connection.request([1], msgid: 2, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        }
    }

    @Test("concurrent requests from several clients each get their own reply")
    func concurrentRequesters() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("busy")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let clients = try (0..<3).map { _ in try transport.connect(to: endpoint, options: .defaults) }
        defer { clients.forEach { $0.invalidate() } }
        try await expectConcurrentEchoes(from: clients, msgid: PeerRequest.echo)
    }

    @Test("SIGKILL of the server mid-request: the request fails with peerInvalidated and invalidation fires once")
    func serverKilledMidRequest() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("victim")
        let server = try startServer(endpoint)
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let pending = Task {
            try await connection.request([1], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(300))
        server.kill()
        let outcome = await withDeadlineResult(seconds: 10) { try await pending.value }
        guard case .failure(let error as IPCError) = outcome else {
            Issue.record("expected the pending request to fail with an IPCError, got \(outcome)")
            return
        }
        #expect(error.code == .peerInvalidated)
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerDied)
        // The client removed what the dead server left: its queue and its reply queue.
        #expect(!MessageQueue.exists(name: PortNames.serverQueue(endpoint)))
        #expect(!MessageQueue.exists(name: try #require(connection.replyQueueName)))
        // Set on a port that is already invalid: fires at once.
        let late = InvalidationProbe()
        late.attach(to: connection)
        #expect(late.count == 1)
        #expect(probe.count == 1)
    }

    @Test("SIGKILL of a client: the server invalidates it, removes its reply queue, and serves others")
    func clientKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("server")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let client = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client) }
        let accepted = try await withDeadline(seconds: 30, "accepting the client") {
            for await connection in listener.connections { return connection }
            throw IPCError(code: .endpointNotFound, message: "listener closed")
        }
        #expect(accepted.peer?.pid == client.pid)
        // The client gives the name up once it reads the welcome; it may or may not have yet.
        let replyQueue = PortNames.replyQueue(endpoint, pid: client.pid, serial: 1)
        let probe = InvalidationProbe()
        probe.attach(to: accepted)
        client.kill()
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerDied)
        #expect(!MessageQueue.exists(name: replyQueue))
        #expect(listener.activeConnections.isEmpty)
        let other = try await transport.connect(to: endpoint, options: .defaults)
        defer { other.invalidate() }
        #expect(try await other.request([7], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [7])
    }

    @Test("a restarted server reclaims the name; a cached port reports invalid and a new lookup recovers")
    func staleNameReclaim() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("restart")
        let first = try startServer(endpoint)
        let cached = try await transport.connect(to: endpoint, options: .defaults)
        let probe = InvalidationProbe()
        probe.attach(to: cached)
        first.kill()
        first.waitForExit()
        #expect(await probe.wait(seconds: 10))
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }

        let second = try startServer(endpoint)
        defer { second.stop() }
        await expectIPCError(.invalidated) {
            try await cached.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(1), receiveTimeout: .seconds(1))
        }
        let fresh = try await transport.connect(to: endpoint, options: .defaults)
        defer { fresh.invalidate() }
        #expect(fresh.peer?.pid == second.pid)
        #expect(try await echo(fresh, [4, 2]) == [4, 2])
        // A live server's name is never taken over.
        await expectIPCError(.endpointInUse) { try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil) }
    }

    @Test("a listener whose queue name was removed, or taken by another queue, registers a new queue; old and new clients are served")
    func lostNameIsRecovered() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("renamed")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let old = try await transport.connect(to: endpoint, options: .defaults)
        defer { old.invalidate() }
        let name = PortNames.serverQueue(endpoint)
        for sabotage in ["removed", "replaced"] {
            // Another process of this user: the name removed, or a queue of its own put there.
            MessageQueue.unlink(name: name)
            if sabotage == "replaced" { try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64).close() }
            let fresh = try await withDeadline(seconds: 30, "a connect after the name was \(sabotage)") { () -> MessagePortConnection in
                while true {
                    // A connect into the impostor's queue gets no welcome: give up on it fast.
                    if let connection = try? await MessagePortTransport(connectTimeout: .milliseconds(300)).connect(to: endpoint, options: .defaults) { return connection }
                    try await Task.sleep(for: .milliseconds(100))
                }
            }
            defer { fresh.invalidate() }
            #expect(try await fresh.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [1], "after the name was \(sabotage)")
            #expect(try await old.request([2], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [2], "the old client, after the name was \(sabotage)")
        }
    }

    @Test("a name removed again and again: the listener closes the replacement queues that nobody uses (it kept one each time, until the user's queue quota was gone); clients old and new are served")
    func repeatedlyLostNameKeepsFewQueues() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("churn")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let old = try await transport.connect(to: endpoint, options: .defaults)
        defer { old.invalidate() }
        let name = PortNames.serverQueue(endpoint)
        for round in 0..<8 {
            // Removed by another process of this user; the listener makes a new queue within
            // its check period.
            let before = MessageQueue.inode(named: name)
            MessageQueue.unlink(name: name)
            try await withDeadline(seconds: 30, "the name back after removal \(round + 1)") {
                while MessageQueue.inode(named: name) == nil || MessageQueue.inode(named: name) == before {
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
        }
        // The one the name leads to now, and at most the two before (each closed at its second
        // idle check).
        #expect(listener.replacementQueueCount <= 3, "\(listener.replacementQueueCount) replacement queues kept")
        let fresh = try await transport.connect(to: endpoint, options: .defaults)
        defer { fresh.invalidate() }
        #expect(try await fresh.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [1])
        #expect(try await old.request([2], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [2])
        // A replacement a live client said hello through is kept while the name moves on.
        MessageQueue.unlink(name: name)
        try await Task.sleep(for: MessagePortListener.nameCheckPeriod * 3)
        #expect(try await fresh.request([3], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [3])
    }

    @Test("a client that gave up while a slow accept filter decided on it is not admitted afterwards (it was, as a connection nobody used, kept until its process exited)")
    func gaveUpDuringFilter() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("slowfilter")
        let decided = Mutex(0)
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: { _ in
            // blocking-call-check: allowed (the listener runs its filter on a queue of its own, off the loop and off this test's task)
            usleep(2_000_000)
            decided.withLock { $0 += 1 }
            return true
        })
        defer { listener.close() }
        let impatient = MessagePortTransport(connectTimeout: .milliseconds(500))
        await expectIPCError(.endpointNotFound) { _ = try await impatient.connect(to: endpoint, options: .defaults) }
        let deadline = ContinuousClock.now + .seconds(30)
        while decided.withLock({ $0 }) == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        try #require(decided.withLock { $0 } == 1, "the filter was not asked")
        // The filter's yes goes back to the loop, which would admit the client then.
        try await Task.sleep(for: .milliseconds(500))
        #expect(listener.activeConnections.isEmpty, "a client that gave up was admitted")
        // A patient client is admitted, the filter's 2 s and all.
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(listener.activeConnections.count == 1)
    }

    @Test("a close that meets a name check about to replace the port's queue leaves no queue under the name (the check made one after the close had given the name up, and nothing closed it)")
    func closeDuringNameCheck() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("closing")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        let name = PortNames.serverQueue(endpoint)
        // The check, on the loop's thread, tells the test it is about to make a queue, then
        // waits long enough for the test's close to run meanwhile.
        let checking = DispatchSemaphore(value: 0)
        listener.willReplaceName.withLock {
            $0 = {
                checking.signal()
                usleep(300_000)
            }
        }
        MessageQueue.unlink(name: name)
        let reached = await Task.detached { checking.wait(timeout: .now() + 30) == .success }.value
        #expect(reached, "no name check came within 30 s of the name's removal")
        listener.close()
        // Long enough for a replacement made after the close to be registered and seen.
        try await Task.sleep(for: .seconds(1))
        #expect(MessageQueue.inode(named: name) == nil, "a queue is registered under the closed port's name")
        #expect(listener.replacementQueueCount == 0)
    }

    @Test("no queue is left behind after a clean close")
    func noLeakedQueues() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("tidy")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        let client = try await transport.connect(to: endpoint, options: .defaults)
        let replyQueue = try #require(client.replyQueueName)
        // Once connected, the reply queue has no name left to leak: the server holds it open.
        #expect(!MessageQueue.exists(name: replyQueue))
        #expect(try await client.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [1])
        let probe = InvalidationProbe()
        probe.attach(to: client)
        client.invalidate()
        #expect(await probe.wait(seconds: 10))
        listener.close()
        #expect(!MessageQueue.exists(name: PortNames.serverQueue(endpoint)))
        #expect(!MessageQueue.exists(name: replyQueue))
    }

    @Test("a listener removes the reply queues clients killed before their hello left behind, when it starts and when it closes", .enabled(if: queueFileSystemMounted))
    func deadClientReplyQueueRemoved() throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("orphan")
        // A process that has exited: its pid is free (not reused within the test, in practice).
        let exited = Process()
        exited.executableURL = URL(fileURLWithPath: "/bin/true")
        try exited.run()
        exited.waitUntilExit()
        let orphan = PortNames.replyQueue(endpoint, pid: exited.processIdentifier, serial: 1)
        let laterOrphan = PortNames.replyQueue(endpoint, pid: exited.processIdentifier, serial: 2)
        let live = PortNames.replyQueue(endpoint, pid: getpid(), serial: 999)
        for name in [orphan, live] {
            try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64).close()
        }
        defer { MessageQueue.unlink(name: live) }
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        #expect(!MessageQueue.exists(name: orphan))
        // One left while the listener runs (a client killed between creating it and its hello).
        try MessageQueue.create(name: laterOrphan, maximumMessages: 1, messageSize: 64).close()
        listener.close()
        #expect(!MessageQueue.exists(name: laterOrphan))
        #expect(MessageQueue.exists(name: live))
    }
}

/// Whether POSIX queue names can be listed: their file system is mounted at /dev/mqueue.
private let queueFileSystemMounted = ((try? String(contentsOfFile: "/proc/self/mounts", encoding: .utf8)) ?? "").contains(" /dev/mqueue mqueue ")

/// A message-port server reads every client's messages on one thread, so it cannot wait for
/// one slow application: a connection whose buffer overflows is invalidated with a typed error.
@Suite("Message port: bounded message buffer", .usesMessageQueues)
struct MessagePortMessageBufferTests {
    @Test("a client bursting into a server connection whose application does not read is invalidated with receiveBufferFull")
    func overflowInvalidates() async throws {
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("slow-reader")
        let limit = ConnectionOptions.BufferLimit(messages: 4, bytes: 1 << 20)
        let listener = try MessagePortTransport().listen(at: endpoint, options: .defaults { $0.messageBufferLimit = limit }, acceptFilter: nil)
        defer { listener.close() }
        let client = try await runBlocking { try PeerProcess(transport: "message-port", framing: .binary, endpoint: endpoint, role: .client, burst: (50, 64)) }
        defer { client.stop() }
        let connection = try await acceptOne(listener)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        #expect(await probe.wait(seconds: 20))
        #expect(probe.reason?.error?.code == .receiveBufferFull, "\(String(describing: probe.reason))")
        // What was buffered before the overflow is still delivered, in order.
        var received: [UInt32] = []
        for await message in connection.messages { received.append(message.msgid) }
        #expect(received == (0..<UInt32(received.count)).map { $0 } && received.count >= limit.messages)
    }
}

/// The listener on the event loop: connections cost queues and descriptors, not threads.
@Suite("Message port: many connections on one event loop", .serialized, .usesMessageQueues)
struct MessagePortScaleTests {
    @Test("as many connections as one process may hold are served without a thread each; one more is refused with a clear error")
    func manyConnections() async throws {
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "manyConnections")
        }
        let group = try TestGroup()
        let endpoint = try group.scopedEndpoint("crowd")
        // Small queues, so that 65 reply queues fit the default per-user quota (RLIMIT_MSGQUEUE,
        // 800 KiB: about nine queues of the default 10 × 8 KiB).
        let transport = MessagePortTransport(queueLimits: (maximumMessages: 4, messageSize: 1024))
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload } }, acceptFilter: nil)
        defer { listener.close() }
        var clients: [MessagePortConnection] = []
        defer { clients.forEach { $0.invalidate() } }
        clients.append(try await transport.connect(to: endpoint, options: .defaults))
        #expect(try await clients[0].request([1], msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1])
        let before = ChildProcessTest.threadCount()
        let count = MessagePortListener.maximumClientsPerProcess
        while clients.count < count {
            clients.append(try await transport.connect(to: endpoint, options: .defaults))
        }
        try await withDeadline(seconds: 30, "admitting \(count) connections") {
            while listener.activeConnections.count < count { try await Task.sleep(for: .milliseconds(10)) }
        }
        // Both ends of every connection are served by the loop's one thread.
        let during = ChildProcessTest.threadCount()
        #expect(during <= before + 2, "threads \(before) with one connection, \(during) with \(count)")
        print("scale: \(count) message-port connections, threads \(before) → \(during)")
        // One more from this process is refused at once, and says why (not a connect timeout).
        let started = ContinuousClock.now
        do {
            let extra = try await transport.connect(to: endpoint, options: .defaults)
            extra.invalidate()
            Issue.record("connection \(count + 1) from one process was admitted")
        } catch let error as IPCError {
            #expect(error.code == .transportFailure && error.message.contains("already has \(count) connections"), "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(3), "the refusal took \(ContinuousClock.now - started)")
        // Every connection is served.
        for (index, client) in clients.enumerated().shuffled() {
            let payload = [UInt8(truncatingIfNeeded: index), 7]
            #expect(try await client.request(payload, msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == payload)
        }
    }
}
