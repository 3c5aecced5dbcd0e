import FilePresenterTransport
import IPCFileCoordination
import Foundation
import IPCCore
import IPCTestSupport
import Synchronization
import Testing
import IPCConformance

/// Coordinated reads and writes between this process and a second one (`CoordinationPeer`).
@Suite("File presenter: coordination")
struct FileCoordinationTests {
    // Coordinated accesses wait for locks: on a thread of their own (`runBlocking`), not on
    // one of the cooperative pool's two threads, which every other test of the process needs.
    private func write(_ text: String, to path: String) async throws {
        try await runBlocking { try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array(text.utf8)) } }
    }

    private func read(_ path: String, timeout: Duration = .seconds(10)) async throws -> String {
        try await runBlocking { try FileCoordinator().coordinate(readingItemAt: path, timeout: timeout) { String(decoding: try $0.read(), as: UTF8.self) } }
    }

    @Test("a writer in another process excludes reads and writes; readers share; the timeout is a typed error")
    func exclusionAcrossProcesses() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/item"
        try await write("first", to: path)
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        try await peer.run("hold-write item")
        await expectIPCError(.coordinationTimeout) { try await read(path, timeout: .milliseconds(200)) }
        await expectIPCError(.coordinationTimeout) {
            try FileCoordinator().coordinate(writingItemAt: path, timeout: .milliseconds(200)) { try $0.replaceContents(with: [1]) }
        }
        try await peer.run("release")
        #expect(try await read(path) == "first")

        try await peer.run("hold-read item")
        #expect(try await read(path, timeout: .milliseconds(200)) == "first")
        await expectIPCError(.coordinationTimeout) {
            try FileCoordinator().coordinate(writingItemAt: path, timeout: .milliseconds(200)) { try $0.replaceContents(with: [1]) }
        }
        try await peer.run("release")
        try await write("second", to: path)
        #expect(try await peer.run("read item") == "second")
        try await peer.run("write item third")
        #expect(try await read(path) == "third")
    }

    @Test("coordinated reads never see a write half done, while plain reads do")
    func readsSeeWholeWrites() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/item"
        try await write(String(repeating: "z", count: 4096), to: path)
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        // Plain reads on another thread show that the peer's writes really are visible half done.
        let stopPlainReads = Atomic<Bool>(false)
        let mixedPlainReads = Atomic<Int>(0)
        let plainReader = Thread {
            while !stopPlainReads.load(ordering: .relaxed) {
                if let bytes = FileManager.default.contents(atPath: path), Set(bytes).count > 1 {
                    mixedPlainReads.add(1, ordering: .relaxed)
                }
            }
        }
        plainReader.start()
        defer { stopPlainReads.store(true, ordering: .relaxed) }

        var coordinatedReads = 0
        var torn: [String] = []
        // Rounds of 100 writes, until a plain read has caught one half done (on a busy machine
        // the plain reader may need more than one round to be running at the right moment).
        for _ in 0..<20 where mixedPlainReads.load(ordering: .relaxed) == 0 {
            peer.start("write-halves item 100")
            while !peer.hasAnswer {
                let bytes = try FileCoordinator().coordinate(readingItemAt: path, timeout: .seconds(10)) { try $0.read() }
                coordinatedReads += 1
                if bytes.count != 4096 || Set(bytes).count != 1 { torn.append("\(bytes.count) bytes of \(Set(bytes).sorted())") }
            }
            #expect(try await peer.answer() == "OK")
        }
        #expect(coordinatedReads > 0)
        #expect(torn.isEmpty, "coordinated reads saw: \(torn.prefix(3))")
        let mixed = mixedPlainReads.load(ordering: .relaxed)
        #expect(mixed > 0, "the test cannot tell: no plain read saw a half-done write")
    }

    @Test("a writer killed with SIGKILL while it holds the lock blocks nobody: others go on within a second")
    func killedWriterReleasesTheLock() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/item"
        try await write("before", to: path)
        let peer = try CoordinationPeer(group: group.directory)
        try await peer.run("hold-write item")
        // Already waiting when the writer dies, on a thread of its own: a blocking wait on the
        // cooperative pool (two threads here) could keep this test from going on to kill the
        // writer until the wait had timed out, as it once did in a full run.
        let waiting = Task {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<String, any Error>) in
                Thread.detachNewThread {
                    continuation.resume(with: Result {
                        try FileCoordinator().coordinate(readingItemAt: path, timeout: .seconds(20)) { String(decoding: try $0.read(), as: UTF8.self) }
                    })
                }
            }
        }
        try await Task.sleep(for: .milliseconds(200))
        peer.kill()
        // The timeout is the requirement: taking the lock must not need more than a second.
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(1)) { try $0.replaceContents(with: Array("after".utf8)) }
        let seen = try await withDeadline(seconds: 10, "the waiting reader") { try await waiting.value }
        #expect(seen == "before" || seen == "after")
        #expect(try await read(path, timeout: .seconds(1)) == "after")
    }

    @Test("two coordinated files in one process exclude each other, and one file serializes its threads")
    func exclusionWithinOneProcess() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/item"
        let first = try CoordinatedFile(path: path)
        let second = try CoordinatedFile(path: path)
        let coordinator = FileCoordinator()
        try coordinator.coordinate(writingItem: first, timeout: .seconds(1)) { _ in
            #expect(throws: IPCError.self) {
                try coordinator.coordinate(readingItem: second, timeout: .milliseconds(100)) { _ in }
            }
            // The same file from another thread waits too (the kernel lock alone would let it in).
            let sameFile = Thread.detachedResult {
                try coordinator.coordinate(readingItem: first, timeout: .milliseconds(100)) { _ in }
            }
            #expect(throws: IPCError.self) { try sameFile.get() }
        }
        try coordinator.coordinate(readingItem: first, timeout: .seconds(1)) { _ in
            try coordinator.coordinate(readingItem: second, timeout: .seconds(1)) { _ in }
        }
    }

    @Test("a coordinated read cannot write")
    func readsCannotWrite() async throws {
        let group = try TestGroup()
        let path = group.directory.path + "/item"
        try await write("x", to: path)
        await expectIPCError(.accessDenied) {
            try FileCoordinator().coordinate(readingItemAt: path, timeout: .seconds(1)) { try $0.write([1], at: 0) }
        }
        await expectIPCError(.transportFailure) { try await read(group.directory.path + "/missing") }
    }
}

extension Thread {
    /// Runs `body` on a new thread and waits for its result.
    static func detachedResult(_ body: @escaping @Sendable () throws -> Void) -> Result<Void, any Error> {
        let result = Mutex<Result<Void, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let outcome = Result { try body() }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return result.withLock { $0! }
    }
}
