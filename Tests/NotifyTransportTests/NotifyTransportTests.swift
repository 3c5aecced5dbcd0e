import CIPCShims
import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCSystem
import IPCTestSupport
import NotifyTransport
import Testing
import IPCConformance
import IPCEngine
import SystemPackage

/// The message transport over notifications and a shared store, with peer processes.
@Suite("Notify transport")
struct NotifyTransportTests {
    /// Names this test's stores, so that stores of tests running beside it are not counted.
    let label = NotifyStores.uniqueLabel()
    var transport: NotifyTransport { NotifyTransport(storeLabel: label) }

    /// Runs a system tool to completion; its exit status.
    private func run(_ tool: String, _ arguments: [String]) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        return process.terminationStatus
    }

    /// The stores of this test's clients that this process maps (one per live connection end).
    private func storesMapped() -> [String] {
        NotifyStores.paths(of: getpid(), label: label)
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

    @Test("a connect the listener does not answer in time is its busy answer while a process holds the endpoint (a stopped listener), and nobody listening when none does (a socket another process put there)")
    func unansweredConnect() async throws {
        let group = try TestGroup()
        let transport = NotifyTransport(connectTimeout: .milliseconds(500))
        // A real listener, stopped: it holds the endpoint's lock, and answers nothing.
        let endpoint = try group.endpoint("stopped")
        let peer = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        // Resumed whatever happens, before it is stopped (which waits for it to exit).
        defer { kill(peer.pid, SIGCONT) }
        #expect(await stopProcess(peer.pid), "the listener was not seen stopped")
        do {
            _ = try await transport.connect(to: endpoint, options: .defaults)
            Issue.record("a stopped listener accepted a connection")
        } catch let error as IPCError {
            #expect(error.code == .endpointNotFound)
            #expect(error.isListenerBusy, "a stopped listener's silence read as nobody listening: \(error)")
            #expect(error.listenerBusyCause?.answered == false, "a stopped listener's silence read as an answer: \(error)")
        }
        kill(peer.pid, SIGCONT)
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([4], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [4])

        // A socket at the rendezvous path that listens, but whose process does not hold the
        // endpoint: nobody's listener.
        let squatted = try group.endpoint("squatted")
        let socket = try UnixSocket.listen(path: transport.activationSocketPath(for: squatted))
        defer { try? socket.close() }
        do {
            _ = try await transport.connect(to: squatted, options: .defaults)
            Issue.record("a socket nobody answers on gave a connection")
        } catch let error as IPCError {
            #expect(error.code == .endpointNotFound)
            #expect(!error.isListenerBusy, "a socket that no listener of the endpoint holds read as a busy listener: \(error)")
        }
    }

    @Test("request/reply echoes payloads from 0 B to 16 MiB (larger than the ring)")
    func echo() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("echo")
        let peer = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(connection.peer?.pid == peer.pid)
        for size in [0, 1, 64, 4096, 65_536, (1 << 20) - 19, 1 << 20, 16 << 20] {
            let payload = periodicBytes(size, step: 13, offset: size)
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
        let senders = try await runBlocking {
            try (0..<3).map { _ in try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (count, 100)) }
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

    @Test("a sender killed while writing a message: no partial message, the next message still arrives, its store is released")
    func senderKilledMidWrite() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("torn")
        let size = 256 << 20
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.maximumPayloadLength = size }, acceptFilter: nil)
        defer { listener.close() }
        // Two 256 MiB messages, 256 times the ring each. A thread of its own (not one of the
        // test's tasks, which can be starved) polls the store's write index every 20 µs or so
        // and kills the sender once 2 MiB of message 1 are published, 254 MiB before it could
        // finish (a window of many milliseconds even at memory speed). Polling, not spinning: a
        // spinning thread held one of the machine's two cores while the sender started, and
        // the watch then once gave up before the burst began (a full test run, loaded).
        let frame = UInt64(BinaryWireFormat.headerLength + size)
        let killed = LockedValue<(written: UInt64, pid: Int32, inode: UInt64)?>(nil)
        let writerPID = LockedValue<Int32?>(nil)
        let watching = LockedValue(true)
        // Started before the sender exists, so it is watching when the burst begins; it stops
        // when the test is over, whatever happened.
        Thread.detachNewThread {
            var store: (header: UnsafeMutableRawPointer, writer: Int32, inode: UInt64)?
            var pause = timespec(tv_sec: 0, tv_nsec: 20_000)
            while watching.get() {
                guard let (header, writer, inode) = store else {
                    // The sender's store, once it is connected (a memfd it maps).
                    if let pid = writerPID.get(), let mapping = NotifyStores.mappings(of: pid).first {
                        let fd = open(mapping.path, O_RDONLY | O_CLOEXEC)
                        if fd >= 0, let address = mmap(nil, 4096, PROT_READ, MAP_SHARED, fd, 0), address != MAP_FAILED {
                            store = (address, pid, mapping.inode)
                        }
                        if fd >= 0 { close(fd) }
                    }
                    nanosleep(&pause, nil)
                    continue
                }
                let written = ipc_atomic_load_u64((header + 64).assumingMemoryBound(to: UInt64.self))
                if written >= frame + (2 << 20) {
                    kill(writer, SIGKILL)
                    killed.set((written, writer, inode))
                    munmap(header, 4096)
                    return
                }
                nanosleep(&pause, nil)
            }
            if let (header, _, _) = store { munmap(header, 4096) }
        }
        defer { watching.set(false) }
        let victim = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (2, size)) }
        writerPID.set(victim.pid)
        let connection = try #require(try await accept(1, on: listener).first)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let progress = LockedValue(0)
        let delivered: [ReceivedMessage]
        do {
            delivered = try await withDeadline(seconds: 120, "the burst") { () -> [ReceivedMessage] in
                var delivered: [ReceivedMessage] = []
                for await message in connection.messages {
                    delivered.append(message)
                    progress.set(delivered.count)
                }
                return delivered
            }
        } catch {
            // Say which part did not happen: the kill, or the end of the stream after it.
            let kill = killed.get().map { "the sender was killed with \($0.written) bytes published" } ?? "the sender was never killed"
            Issue.record("\(error); \(kill); \(progress.get()) messages delivered; connection \(connection.invalidationReason.map { "invalidated: \($0)" } ?? "still valid")")
            return
        }
        let (written, killedPID, inode) = try #require(killed.get(), "the sender never reached message 1")
        #expect(killedPID == victim.pid)
        #expect(written < 2 * frame, "the kill did not land while message 1 was being written")
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .peerDied)
        // Message 0 whole, and nothing of the half-written message 1.
        #expect(delivered.map(\.msgid) == [0])
        #expect(delivered.first?.payload == PeerService.burstPayload(0, size: size))
        #expect(!NotifyStores.maps(getpid(), inode: inode), "the listener still maps the dead sender's store")

        let next = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (1, 64)) }
        defer { next.stop() }
        let nextConnection = try #require(try await accept(1, on: listener).first)
        let received = try await collect(1, from: nextConnection)
        #expect(received.first?.payload == PeerService.burstPayload(0, size: 64))
    }

    @Test("SIGKILL of the server: the client invalidates once, fails its pending request, and releases its store")
    func serverKilled() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("server")
        let peer = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let pending = Task {
            try await connection.request([1], msgid: PeerRequest.stall, sendTimeout: .seconds(5), receiveTimeout: .seconds(60))
        }
        try await Task.sleep(for: .milliseconds(200))
        #expect(storesMapped().count == 1)
        peer.kill()
        let outcome = await withDeadlineResult(seconds: 10) { try await pending.value }
        guard case .failure(let error as IPCError) = outcome else {
            Issue.record("expected the pending request to fail with an IPCError, got \(outcome)")
            return
        }
        #expect(error.code == .peerInvalidated)
        #expect(await probe.wait(seconds: 10))
        #expect(probe.count == 1)
        #expect(storesMapped().isEmpty)
        await expectIPCError(.invalidated) { try connection.send([1], msgid: 1, timeout: .seconds(1)) }
    }

    @Test("a peer bursting more than the ring holds into a connection whose application does not read: at most the limit is buffered, then everything arrives in order")
    func backpressure() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("slow-reader")
        let limit = ConnectionOptions.BufferLimit(messages: 8, bytes: 1 << 20)
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.messageBufferLimit = limit }, acceptFilter: nil)
        defer { listener.close() }
        // 4,000 messages of 1 KiB: about four times the ring, so the sender waits for room (its
        // doorbell rung by the reader) once the reader stops at the limit, and again and again
        // as the application reads.
        let count = 4_000
        let client = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .client, burst: (count, 1024)) }
        defer { client.stop() }
        let connection = try #require(try await accept(1, on: listener).first)
        try await Task.sleep(for: .milliseconds(500))
        #expect(connection.bufferedMessageCount == limit.messages)
        let received = try await collect(count, from: connection, seconds: 300)
        #expect(received.map(\.msgid) == (0..<count).map { UInt32($0) })
        #expect(received.enumerated().allSatisfy { $0.element.payload == PeerService.burstPayload($0.offset, size: 1024) })
        #expect(connection.bufferedMessageCount <= limit.messages)
    }

    @Test("a listener with 1,000 idle connections runs no thread per connection, and serves them all")
    func thousandIdleConnections() async throws {
        // In a process of its own: Foundation's Process.run has crashed the process that spawns
        // while some thousands of descriptors are open (see UnixSocketScaleTests), and a test
        // beside this one that starts a peer would do exactly that (c5c359d's CI run).
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "thousandIdleConnections")
        }
        let group = try TestGroup()
        let endpoint = try group.endpoint("crowd")
        // The smallest ring (4 KiB): 2,000 stores of the default 1 MiB would map 4 GiB.
        let small = NotifyTransport(ringCapacity: 4096, storeLabel: label)
        let listener = try small.listen(at: endpoint, options: .defaults {
            $0.requestHandler = { _, payload in payload }
            $0.requestHandlerExecutor = .eventLoop
        }, acceptFilter: nil)
        defer { listener.close() }
        // The synchronous connect, on this task's thread (a non-async closure chooses it): the
        // async one would start a thread for each.
        let connect: () throws -> NotifyConnection = { try small.connect(to: endpoint, options: .defaults) }
        // A first connection, so that the loop and the process watcher run before counting.
        let first = try connect()
        defer { first.invalidate() }
        _ = try await first.request([1], msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30))
        let before = ChildProcessTest.threadCount()
        let count = 1_000
        var clients: [NotifyConnection] = [first]
        defer { clients.forEach { $0.invalidate() } }
        for _ in 1..<count {
            clients.append(try connect())
        }
        try await withDeadline(seconds: 60, "accepting \(count) connections") {
            while listener.activeConnections.count < count { try await Task.sleep(for: .milliseconds(10)) }
        }
        // Both ends of every connection are this process's: the loop thread serves all 2,000.
        let during = ChildProcessTest.threadCount()
        #expect(during <= before + 2, "\(count) notify connections took the process from \(before) to \(during) threads")
        print("scale: \(count) notify connections, both ends here, threads \(before) → \(during)")
        for client in clients.shuffled().prefix(50) {
            #expect(try await client.request([7, 7], msgid: 1, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [7, 7])
        }
    }

    @Test("a dead listener's name can be taken over; a live one's cannot")
    func takeOver() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("owned")
        let peer = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        await expectIPCError(.endpointInUse) { try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil) }
        peer.kill()
        peer.waitForExit()
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }
        let listener = try transport.listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        #expect(try await connection.request([3], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [3])
    }

    @Test("the store cannot change size: its memfd is sealed, and truncating it from another process fails")
    func sealedStore() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("sealed")
        let peer = try await runBlocking { try PeerProcess(transport: "notify", framing: .binary, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let path = try #require(NotifyStores.paths(of: peer.pid, label: label).first, "the server maps no store")
        let payload = [UInt8](repeating: 9, count: 256 * 1024)
        for _ in 0..<40 {
            #expect(try await connection.request(payload, msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10)) == payload)
        }
        // Another process (the truncation that used to kill the mapping process with SIGBUS).
        #expect(try run("/usr/bin/truncate", ["--size", "0", path]) != 0, "truncate(1) shrank the store")
        let fd = open(path, O_RDWR | O_CLOEXEC)
        defer { close(fd) }
        #expect(ftruncate(fd, 0) != 0 && errno == EPERM)
        #expect(ftruncate(fd, 1 << 30) != 0 && errno == EPERM)
        #expect(try await connection.request([1], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(10)) == [1])
        #expect(peer.isRunning)
    }

    @Test("clients that connect and say nothing hold at most 64 handshakes; the next are told busy; once they go, clients are served")
    func silentClients() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("silent")
        let listener = try NotifyTransport(connectTimeout: .seconds(120)).listen(at: endpoint, options: .defaults { $0.requestHandler = { _, payload in payload }; $0.requestHandlerExecutor = .eventLoop }, acceptFilter: nil)
        defer { listener.close() }
        let path = group.directory.path + "/silent.rendezvous"
        var silent = try (0..<(NotifyListener.maximumPendingHandshakes + 8)).map { _ in try UnixSocket.connect(path: path) }
        defer { silent.forEach { try? $0.close() } }
        // The listener answers the ones beyond the bound: 4 (busy), then closes them.
        var answers: [UInt8] = []
        for fd in silent.suffix(8) {
            let answer = try await withDeadline(seconds: 30, "the busy answer") { () -> UInt8 in
                var word = [UInt8](repeating: 0, count: 4)
                let count = word.withUnsafeMutableBytes { recv(fd.rawValue, $0.baseAddress, 4, 0) }
                return count == 4 ? word[0] : 0
            }
            answers.append(answer)
        }
        #expect(answers == [UInt8](repeating: 4, count: 8), "answers to the clients beyond the bound: \(answers)")
        await expectIPCError(.endpointNotFound) { try transport.connect(to: endpoint, options: .defaults) }
        // The silent clients hang up: the listener lets them go, and serves a real client.
        silent.forEach { try? $0.close() }
        silent = []
        let client = try await withDeadline(seconds: 30, "a connect once the silent clients are gone") { () -> NotifyConnection in
            while true {
                do { return try await transport.connect(to: endpoint, options: .defaults) } catch let error as IPCError where error.code == .endpointNotFound {
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
        }
        defer { client.invalidate() }
        #expect(try await client.request([5], msgid: 1, sendTimeout: .seconds(5), receiveTimeout: .seconds(10)) == [5])
    }

    @Test("a client that connects and says nothing is dropped after the handshake timeout")
    func silentClientTimesOut() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("mute")
        let listener = try NotifyTransport(connectTimeout: .milliseconds(200)).listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let fd = try UnixSocket.connect(path: group.directory.path + "/mute.rendezvous")
        defer { try? fd.close() }
        // The listener closes it without an answer: end of stream.
        let count = try await withDeadline(seconds: 30, "the listener dropping a silent client") { () -> Int in
            var byte: UInt8 = 0
            return recv(fd.rawValue, &byte, 1, 0)
        }
        #expect(count == 0)
    }

    @Test("the accept filter sees the client's kernel-verified credentials; a refused client's connect fails with accessDenied")
    func acceptFilter() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("filtered")
        let seen = LockedValue<[PeerCredentials]>([])
        let listener = try transport.listen(at: endpoint, options: .defaults) { credentials in
            seen.set(seen.get() + [credentials])
            return seen.get().count > 1
        }
        defer { listener.close() }
        await expectIPCError(.accessDenied) { try transport.connect(to: endpoint, options: .defaults) }
        let second = try await transport.connect(to: endpoint, options: .defaults)
        defer { second.invalidate() }
        #expect(seen.get().map(\.pid) == [getpid(), getpid()])
        #expect(seen.get().allSatisfy { $0.uid == geteuid() && $0.gid == getegid() })
        #expect(second.peer?.pid == getpid())
        #expect(listener.activeConnections.count == 1)
    }

    @Test("a store corrupted by another process invalidates the connection with a protocol error, no crash")
    func corruptedStore() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("corrupt")
        let listener = try transport.listen(at: endpoint, options: .defaults, acceptFilter: nil)
        defer { listener.close() }
        let client = try await transport.connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        let server = try #require(try await withDeadline(seconds: 30, "accepting") { () -> NotifyConnection? in
            for await connection in listener.connections { return connection }
            return nil
        })
        let probe = InvalidationProbe()
        probe.attach(to: server)
        // A hostile writer in another process: the client-to-server ring's read index ahead of
        // its write index, and no ring of any bell (the periodic check finds it).
        let path = try #require(storesMapped().first)
        let indexes = NSTemporaryDirectory() + "ipcbench-indexes-\(UUID().uuidString)"
        try Data(withUnsafeBytes(of: UInt64(5), Array.init) + withUnsafeBytes(of: UInt64(10), Array.init)).write(to: URL(fileURLWithPath: indexes))
        defer { try? FileManager.default.removeItem(atPath: indexes) }
        #expect(try run("/bin/dd", ["if=\(indexes)", "of=\(path)", "bs=16", "seek=4", "conv=notrunc", "status=none"]) == 0)
        #expect(await probe.wait(seconds: 10))
        #expect(probe.reason?.kind == .protocolError)
        #expect(probe.reason?.error?.code == .malformedFrame)
    }
}
