import Foundation
import IPCBenchKit
import IPCCore
import IPCTestSupport
@testable import FilePresenterTransport
@testable import IPCFileCoordination
import Synchronization
import Testing
import IPCConformance
import IPCEngine
import IPCFraming

/// The message transport against real peer processes (`ipcbench peer --transport file-presenter`).
@Suite("File presenter: transport")
struct FilePresenterTransportTests {
    let transport = FilePresenterTransport()

    private func startServer(_ endpoint: Endpoint) throws -> PeerProcess {
        try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .server)
    }

    private func echo(_ connection: FilePresenterConnection, _ payload: [UInt8]) async throws -> [UInt8] {
        try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
    }

    private func fileSize(_ path: String) throws -> Int {
        try #require(FileManager.default.attributesOfItem(atPath: path)[.size] as? Int)
    }

    private func files(in group: borrowing TestGroup) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: group.directory.path).sorted()
    }

    /// The name of the thread this runs on.
    private static func threadName() -> String {
        ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test("clients read their journals on the event loop: 1,000 connections from one process add no thread each, and all are served")
    func manyClientsNoThreads() async throws {
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "manyClientsNoThreads")
        }
        let group = try TestGroup()
        let endpoint = try group.endpoint("crowd")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload } }, acceptFilter: nil)
        defer { listener.close() }
        let connect: () throws -> FilePresenterConnection = { try transport.connect(to: endpoint, options: .defaults) }
        var clients = [try connect()]
        defer { clients.forEach { $0.invalidate() } }
        #expect(try await echo(clients[0], [1]) == [1])
        let before = ChildProcessTest.threadCount()
        let count = 1_000
        while clients.count < count { clients.append(try connect()) }
        let during = ChildProcessTest.threadCount()
        // One presenter thread per client before: 999 more.
        #expect(during <= before + 2, "threads \(before) with one client, \(during) with \(count)")
        print("scale: \(count) file-presenter clients in one process, threads \(before) → \(during)")
        for (index, client) in clients.enumerated().shuffled() {
            let payload = [UInt8(truncatingIfNeeded: index), 9]
            #expect(try await echo(client, payload) == payload)
        }
    }

    @Test("a client's preferred executor is the event loop, which reads its journal: tasks on it are answered there, and still run after the connection ended")
    func presenterThreadExecutor() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("executor")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        let executor = try #require(connection.preferredTaskExecutor)
        let (replies, threads) = try await withTaskExecutorPreference(executor) {
            var replies: [[UInt8]] = []
            var threads: Set<String> = []
            for index in 0..<50 {
                replies.append(try await echo(connection, [UInt8(index), 1, 2]))
                threads.insert(Self.threadName())
            }
            return (replies, threads)
        }
        #expect(replies == (0..<50).map { [UInt8($0), 1, 2] })
        #expect(threads == ["ipc-loop"], "resumed on \(threads)")
        connection.invalidate()
        // The presenter's thread ends with the connection; a task that prefers it still runs.
        let ran = try await withDeadline(seconds: 30, "a task preferring the ended presenter's thread") {
            await Task(executorPreference: executor) { true }.value
        }
        #expect(ran)
    }

    @Test("a consumer on the event loop, which reads the journal, takes a burst larger than the message buffer: the thread stops reading while the buffer is full, never waits for it, and runs the consumer itself")
    func consumerOnThePresenterThread() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("consumer")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults { $0.messageBufferLimit = .init(messages: 4, bytes: 1 << 20) })
        defer { connection.invalidate() }
        let executor = try #require(connection.preferredTaskExecutor)
        // The server echoes each message; the presenter's thread reads the echoes and stops
        // reading after 4 of them until the task that takes them, which prefers that thread
        // and so runs there, has taken one.
        let count = 2_000
        let sending = Task.detached {
            for index in 0..<count {
                try await connection.send(PeerService.burstPayload(index, size: 64), msgid: UInt32(index), timeout: .seconds(60))
            }
        }
        // An unstructured consumer, watched from here: were the presenter's thread stuck, a
        // deadline inside the consumer would be stuck with it (its timer prefers that thread too).
        let received = Mutex<[UInt32]>([])
        let threads = Mutex<Set<String>>([])
        let consumer = Task(executorPreference: executor) {
            for await message in connection.messages {
                threads.withLock { _ = $0.insert(Self.threadName()) }
                let total = received.withLock { $0.append(message.msgid); return $0.count }
                if total == count { return }
            }
        }
        let deadline = ContinuousClock.now + .seconds(60)
        while received.withLock({ $0.count }) < count, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(10))
        }
        let taken = received.withLock { $0 }
        #expect(taken.count == count, "\(taken.count) of \(count) messages taken")
        #expect(taken.enumerated().allSatisfy { $0.element == UInt32($0.offset) }, "messages out of order")
        #expect(threads.withLock { $0 } == ["ipc-loop"], "the consumer ran on \(threads.withLock { $0 })")
        // Ending the connection ends a stuck wait too, so the tasks finish either way.
        connection.invalidate()
        _ = await consumer.value
        _ = await sending.result
    }

    @Test("a client whose application takes nothing holds no more than its buffer's limit while the peer keeps sending; all arrive, in order, once taken")
    func bufferLimitHoldsWhileStopped() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("limit")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let limit = 4
        let connection = try await transport.connect(to: endpoint, options: .defaults { $0.messageBufferLimit = .init(messages: limit, bytes: 1 << 20) })
        defer { connection.invalidate() }
        // The server echoes each one; spaced out, so that each echo is an append of its own,
        // which wakes the client's presenter.
        let count = 60
        for index in 0..<count {
            try await connection.send(PeerService.burstPayload(index, size: 64), msgid: UInt32(index), timeout: .seconds(60))
            try await Task.sleep(for: .milliseconds(5))
        }
        try await Task.sleep(for: .seconds(1))
        #expect(connection.core.bufferedMessageCount <= limit, "\(connection.core.bufferedMessageCount) messages buffered, over the limit of \(limit)")
        let taken = try await withDeadline(seconds: 60, "taking the echoes") { () -> [UInt32] in
            var taken: [UInt32] = []
            for await message in connection.messages {
                taken.append(message.msgid)
                if taken.count == count { break }
            }
            return taken
        }
        #expect(taken == (0..<count).map { UInt32($0) })
    }

    @Test("an async send to a locked journal suspends its task and leaves its thread free; cancelling the task ends the wait with CancellationError, and nothing is appended; invalidating the connection ends it with peerInvalidated")
    func suspendingSend() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("suspend")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let executor = try #require(connection.preferredTaskExecutor)
        // A lock on the client's outbox through another open file description keeps the
        // client's appends out, as a reader that holds it would.
        let inbox = try CoordinatedFile(path: try #require(connection.outboxPath), create: false)
        try inbox.lock(exclusive: true, timeout: .seconds(10))
        let sending = Task(executorPreference: executor) {
            try await connection.send([1, 2, 3], msgid: 41, timeout: .seconds(120))
        }
        // The send waits; the loop's thread, which it started on, does not: another task
        // that prefers that thread runs there.
        let ran = try await withDeadline(seconds: 60, "a task on the waiting sender's thread") {
            await Task(executorPreference: executor) { Self.threadName() }.value
        }
        #expect(ran == "ipc-loop")
        sending.cancel()
        switch await withDeadlineResult(seconds: 60, { try await sending.value }) {
        case .success: Issue.record("the send went through a locked journal")
        case .failure(let error): #expect(error is CancellationError, "\(error)")
        }
        inbox.unlock()
        try await connection.send([4], msgid: 42, timeout: .seconds(60))
        // The server echoes one-way messages: the first echo is 42's, as 41 never went.
        let first = try await withDeadline(seconds: 60, "the echo") { () -> UInt32? in
            for await message in connection.messages { return message.msgid }
            return nil
        }
        #expect(first == 42)
        // The connection's end ends such a wait too, with `peerInvalidated`, as on every
        // transport (the engine fails what waits to be written when the connection ends).
        try inbox.lock(exclusive: true, timeout: .seconds(10))
        defer { inbox.unlock() }
        let waiting = Task { try await connection.send([5], msgid: 43, timeout: .seconds(120)) }
        try await Task.sleep(for: .milliseconds(200))
        connection.invalidate()
        switch await withDeadlineResult(seconds: 60, { try await waiting.value }) {
        case .success: Issue.record("the send went through a locked journal")
        case .failure(let error): #expect((error as? IPCError)?.code == .peerInvalidated, "\(error)")
        }
    }

    @Test("request/reply echoes payloads from 0 bytes to 4 MiB")
    func echoAcrossSizes() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("echo")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(connection.peer?.pid == server.pid)
        #expect(connection.peer?.uid == getuid())
        for size in [0, 1, 64, 4095, 4096, 16 * 1024 + 1, 65536, 1 << 20, 4 << 20] {
            let payload = periodicBytes(size, step: 7, offset: size)
            #expect(try await echo(connection, payload) == payload, "payload of \(size) bytes")
        }
    }

    @Test("10,000 one-way messages each way arrive exactly once, in order, and the journals are compacted")
    func burstAndCompaction() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("burst")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let count = 10_000
        // 200-byte payloads: about 2.3 MB through each journal, over twice the compaction threshold.
        let receiving = Task { try await collect(count, from: connection, seconds: 120) }
        for index in 0..<count {
            try await connection.send(PeerService.burstPayload(index, size: 200), msgid: UInt32(index), timeout: .seconds(30))
        }
        let received = try await receiving.value
        #expect(received.count == count)
        let outOfPlace = received.enumerated().filter { index, message in
            message.msgid != UInt32(index) || message.payload != PeerService.burstPayload(index, size: 200)
        }
        #expect(outOfPlace.isEmpty, "first misplaced: \(outOfPlace.first.map { "#\($0.offset) has msgid \($0.element.msgid)" } ?? "")")
        // Each journal carried over 2 MiB; compaction keeps a file to about the threshold (1 MiB).
        let bound = (1 << 20) + 64 * 1024
        #expect(try fileSize(try #require(connection.outboxPath)) <= bound)
        #expect(try fileSize(try #require(connection.journalPath)) <= bound)
    }

    @Test("a burst of 10,000 from a client process reaches the listener exactly once, in order")
    func burstFromAnotherProcess() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("inbox")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let client = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .client, burst: (10_000, 64)) }
        defer { client.stop() }
        let connection = try await acceptOne(listener)
        let received = try await collect(10_000, from: connection, seconds: 120)
        #expect(received.map(\.msgid) == (0..<10_000).map { UInt32($0) })
        #expect(received.enumerated().allSatisfy { $0.element.payload == PeerService.burstPayload($0.offset, size: 64) })
    }

    @Test("a partial record from a writer killed while holding its outbox's lock is never delivered, and held up nobody else")
    func tornRecordFromAKilledWriter() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("torn")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let survivor = try await transport.connect(to: endpoint, options: .defaults)
        defer { survivor.invalidate() }
        let survivorSide = try await acceptOne(listener)

        let writer = try CoordinationPeer(group: group.directory)
        writer.start("tear torn")
        let writerSide = try await acceptOne(listener)
        #expect(writerSide.peer?.pid == writer.pid)
        #expect(try await writer.answer() == "OK")
        let writerProbe = InvalidationProbe()
        writerProbe.attach(to: writerSide)
        // The writer holds its outbox's lock with half a record written past the committed end:
        // the survivor writes its own outbox, and goes on.
        try await survivor.send(Array("during".utf8), msgid: 1, timeout: .seconds(10))
        writer.kill()
        try await survivor.send(Array("next".utf8), msgid: 2, timeout: .seconds(10))
        try await survivor.send(Array("after".utf8), msgid: 3, timeout: .seconds(10))
        let received = try await collect(3, from: survivorSide)
        #expect(received.map(\.msgid) == [1, 2, 3])
        #expect(received.map(\.payload) == [Array("during".utf8), Array("next".utf8), Array("after".utf8)])

        #expect(await writerProbe.wait(seconds: 10))
        #expect(writerProbe.reason?.kind == .peerDied)
        // The writer's connection delivered nothing (its stream has ended, empty).
        let fromWriter = try await withDeadline(seconds: 10, "the writer's messages ending") {
            var messages: [ReceivedMessage] = []
            for await message in writerSide.messages { messages.append(message) }
            return messages
        }
        #expect(fromWriter.isEmpty)
        #expect(survivorSide.invalidationReason == nil)
    }

    @Test("a client process stopped (SIGSTOP) while it holds its outbox's lock holds up nobody else: two other clients' requests and a new client's connect go on, timed")
    func stoppedWriterHoldsOnlyItsOwnConnection() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("stalled")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload } }, acceptFilter: nil)
        defer { listener.close() }
        let others = [try await transport.connect(to: endpoint, options: .defaults), try await transport.connect(to: endpoint, options: .defaults)]
        defer { others.forEach { $0.invalidate() } }

        let writer = try CoordinationPeer(group: group.directory)
        defer { writer.kill() }
        #expect(try await runBlocking { try writer.run("tear stalled") } == "")
        // Stopped where it holds its outbox's exclusive lock, part of a record written.
        #expect(kill(writer.pid, SIGSTOP) == 0)
        defer { kill(writer.pid, SIGCONT) }

        // Before the fix (one shared inbox) these failed with sendTimeout and then hung.
        let clock = ContinuousClock()
        let started = clock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, client) in others.enumerated() {
                group.addTask {
                    for round in 0..<50 {
                        let payload = Array("client \(index) round \(round)".utf8)
                        // Generous: a writer that held the others up would hang them for good. These
                        // 100 requests take 0.006 s alone, at most 0.035 s beside any one other test
                        // of this target, about 1 s beside all of them and 18-35 s in the full
                        // suite: the time goes to the other tests (their processes starting, their
                        // debug-build work on the cooperative pool's two threads), not to this
                        // transport (the loop reported no stall).
                        let reply = try await client.request(payload, msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
                        #expect(reply == payload)
                    }
                }
            }
            try await group.waitForAll()
        }
        let requests = clock.now - started
        // A new client connects and is answered while the writer is still stopped.
        let connectStarted = clock.now
        let newcomer = try await transport.connect(to: endpoint, options: .defaults)
        defer { newcomer.invalidate() }
        #expect(try await newcomer.request([7], msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(10)) == [7])
        let connect = clock.now - connectStarted
        print("stalled writer: 100 requests of two other clients took \(requests), a new client's connect and request \(connect)")
        #expect(listener.activeConnections.count == 4)
    }

    @Test("SIGKILL of the listener: a pending request fails, invalidation fires once, and the client removes its journal and outbox")
    func listenerKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("victim")
        let server = try startServer(endpoint)
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let journal = try #require(connection.journalPath)
        let outbox = try #require(connection.outboxPath)
        #expect(FileManager.default.fileExists(atPath: journal))
        #expect(FileManager.default.fileExists(atPath: outbox))
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
        #expect(!FileManager.default.fileExists(atPath: journal))
        #expect(!FileManager.default.fileExists(atPath: outbox))
        connection.invalidate()
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
        let late = InvalidationProbe()
        late.attach(to: connection)
        #expect(late.count == 1)
        #expect(probe.count == 1)
    }

    @Test("SIGKILL of a client: the listener invalidates it, removes its journal, and serves others")
    func clientKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("server")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let client = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .client) }
        let accepted = try await acceptOne(listener)
        #expect(accepted.peer?.pid == client.pid)
        let journal = try #require(try files(in: group).first { $0.hasPrefix("server.\(client.pid)-") && $0.hasSuffix(".journal") })
        let probe = InvalidationProbe()
        probe.attach(to: accepted)
        client.kill()
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerDied)
        #expect(!(try files(in: group).contains(journal)))
        #expect(listener.activeConnections.isEmpty)
        let other = try await transport.connect(to: endpoint, options: .defaults)
        defer { other.invalidate() }
        #expect(try await other.request([7], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [7])
    }

    @Test("a dead listener's name is taken over (its clients' journals removed), a live one's never")
    func takeover() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("restart")
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }
        let first = try startServer(endpoint)
        let client = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .client) }
        await expectIPCError(.endpointInUse) { try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil) }
        client.kill()
        first.kill()
        first.waitForExit()
        #expect(try files(in: group).contains { $0.hasSuffix(".journal") })
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }

        let second = try startServer(endpoint)
        defer { second.stop() }
        #expect(!(try files(in: group).contains { $0.hasSuffix(".journal") }))
        let fresh = try await transport.connect(to: endpoint, options: .defaults)
        defer { fresh.invalidate() }
        #expect(fresh.peer?.pid == second.pid)
        #expect(try await echo(fresh, [4, 2]) == [4, 2])
        await expectIPCError(.endpointInUse) { try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil) }
    }

    @Test("closing both sides leaves only the endpoint's lock file, and each side hears the other's goodbye")
    func cleanup() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("tidy")
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        let client = try await transport.connect(to: endpoint, options: .defaults)
        let accepted = try await acceptOne(listener)
        #expect(try await client.request([1], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [1])
        let serverProbe = InvalidationProbe()
        serverProbe.attach(to: accepted)
        client.invalidate()
        #expect(await serverProbe.wait(seconds: 10))
        #expect(serverProbe.reason?.kind == .peerClosed)

        let second = try await transport.connect(to: endpoint, options: .defaults)
        let clientProbe = InvalidationProbe()
        clientProbe.attach(to: second)
        listener.close()
        #expect(await clientProbe.wait(seconds: 10))
        #expect(clientProbe.reason?.kind == .peerClosed)
        #expect(try files(in: group) == ["tidy.lock"])
    }

    @Test("payload too large, receive timeout, handler failure, full journal and invalid connection are distinct errors")
    func distinctErrors() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("errors")
        let server = try startServer(endpoint)
        defer { server.kill() }
        let connection = try await transport.connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = 2 << 20 })

        await expectIPCError(.payloadTooLarge) { try connection.send([UInt8](repeating: 0, count: (2 << 20) + 1), msgid: 1, timeout: .seconds(1)) }
        await expectIPCError(.transportFailure) {
            try await connection.request([1], msgid: PeerRequest.fail, sendTimeout: .seconds(5), receiveTimeout: .seconds(10))
        }
        // The server never answers a stalled request: no reply, and the connection stays valid...
        await expectIPCError(.receiveTimeout) {
            try await connection.request([1], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .milliseconds(300))
        }
        #expect(connection.invalidationReason == nil)
        // ...and a server that reads nothing (its process stopped) lets the outbox fill (16 MiB),
        // so a send times out.
        kill(server.pid, SIGSTOP)
        defer { kill(server.pid, SIGCONT) }
        let megabyte = [UInt8](repeating: 7, count: 1 << 20)
        await expectIPCError(.sendTimeout) {
            for _ in 0..<40 { try connection.send(megabyte, msgid: 5, timeout: .milliseconds(300)) }
        }
        connection.invalidate()
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
        await expectIPCError(.invalidated) {
            try await connection.request([1], msgid: 1, sendTimeout: .seconds(1), receiveTimeout: .seconds(1))
        }
    }

    @Test("the accept filter sees each client's kernel-verified credentials (a real second process among them); a refused connect fails with accessDenied")
    func acceptFilter() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("filtered")
        let seen = LockedValue<[PeerCredentials]>([])
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }) { credentials in
            seen.set(seen.get() + [credentials])
            return seen.get().count > 1
        }
        defer { listener.close() }
        await expectIPCError(.accessDenied) { try transport.connect(to: endpoint, options: .defaults) }
        #expect(listener.activeConnections.isEmpty)
        let client = try await runBlocking { try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .client) }
        defer { client.stop() }
        let accepted = try await acceptOne(listener)
        #expect(seen.get().map(\.pid) == [getpid(), client.pid])
        #expect(seen.get().allSatisfy { $0.uid == geteuid() && $0.gid == getegid() })
        #expect(accepted.peer?.pid == client.pid)
        #expect(listener.activeConnections.count == 1)
    }

    @Test("concurrent requests from several clients each get their own reply")
    func concurrentRequesters() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("busy")
        let server = try startServer(endpoint)
        defer { server.stop() }
        let clients = try (0..<3).map { _ in try transport.connect(to: endpoint, options: .defaults) }
        defer { clients.forEach { $0.invalidate() } }
        try await expectConcurrentEchoes(from: clients, msgid: PeerRequest.echo)
    }

    @Test("a broadcast reaches every client process")
    func broadcast() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("radio")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let clients = try await runBlocking { try (0..<2).map { _ in try PeerProcess(transport: "file-presenter", framing: .binary, endpoint: endpoint, role: .client) } }
        defer { clients.forEach { $0.stop() } }
        let accepted = [try await acceptOne(listener), try await acceptOne(listener)]
        #expect(listener.broadcast([9, 9], msgid: 42, timeout: .seconds(5)) == 2)
        // Client peers echo one-way messages back.
        for connection in accepted {
            let echoed = try await collect(1, from: connection)
            #expect(echoed.first?.msgid == 42)
            #expect(echoed.first?.payload == [9, 9])
        }
    }
}
