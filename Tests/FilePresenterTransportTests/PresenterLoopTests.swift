import Dispatch
import Foundation
import IPCCore
import IPCEngine
import IPCFileCoordination
import IPCSystem
import IPCTestSupport
import Synchronization
import SystemPackage
import Testing

/// Presenters on the event loop: no thread of their own, and callbacks off the loop, so that one
/// presenter that blocks holds up nobody else. Deadlines are generous (the machine is shared);
/// nothing here asserts how fast anything is.
@Suite("File presenter: on the event loop")
struct PresenterLoopTests {
    private func makeItem(_ group: borrowing TestGroup, _ name: String) throws -> String {
        let path = group.directory.path + "/" + name
        // Nobody presents it yet: nothing to wait for.
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("start".utf8)) }
        return path
    }

    /// A coordinated write, on a thread of its own (`runBlocking`): it waits for presenters.
    private func write(_ text: String, to path: String, timeout: Duration = .seconds(30)) async throws {
        try await runBlocking { try FileCoordinator().coordinate(writingItemAt: path, timeout: timeout) { try $0.replaceContents(with: Array(text.utf8)) } }
    }

    /// The inotify instances this process has open.
    private static func inotifyInstances() -> Int {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return descriptors.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == "anon_inode:inotify" }.count
    }

    @Test("200 presenters in one process start no thread each and share one inotify instance; each is still told and asked")
    func manyPresentersNoThreads() async throws {
        // A process of its own, so that other tests' threads do not blur the count.
        guard ChildProcessTest.isChildRun else {
            return try await ChildProcessTest.run(filter: "manyPresentersNoThreads")
        }
        let group = try TestGroup()
        let count = 200
        let paths = try (0..<count).map { try makeItem(group, "item-\($0)") }
        let changes = (0..<count).map { _ in ChangeCounter() }
        let asked = (0..<count).map { _ in ChangeCounter() }
        // One presenter first, so that the event loop and whatever the process starts once run.
        let first = try FilePresenter(presenting: paths[0], callbacks: FilePresenterCallbacks(didChange: { changes[0].record() }))
        let threadsBefore = ChildProcessTest.threadCount()
        let instancesBefore = Self.inotifyInstances()
        // Half of them answer coordinators: an answering socket each, watched by the loop too.
        var presenters = [first]
        for index in 1..<count {
            var callbacks = FilePresenterCallbacks(didChange: { changes[index].record() })
            if index.isMultiple(of: 2) {
                callbacks.relinquishToWriter = {
                    asked[index].record()
                    return nil
                }
            }
            presenters.append(try FilePresenter(presenting: paths[index], callbacks: callbacks))
        }
        let threadsDuring = ChildProcessTest.threadCount()
        let instancesDuring = Self.inotifyInstances()
        print("scale: \(count) file presenters in one process, threads \(threadsBefore) → \(threadsDuring), inotify instances \(instancesBefore) → \(instancesDuring)")
        // A thread per presenter was 199 more (and an instance each: this user has 128).
        #expect(threadsDuring < threadsBefore + 50, "threads \(threadsBefore) with one presenter, \(threadsDuring) with \(count)")
        #expect(instancesDuring == instancesBefore, "inotify instances \(instancesBefore) with one presenter, \(instancesDuring) with \(count)")
        // Still each told of a write by another coordinator, and asked before it.
        for index in stride(from: 0, to: count, by: 20) + [count - 2, count - 1] {
            try await write("changed", to: paths[index])
            #expect(await changes[index].wait(for: 1, seconds: 60), "presenter \(index) was not told")
            if index > 0, index.isMultiple(of: 2) { #expect(asked[index].count == 1, "presenter \(index) was not asked") }
        }
        presenters.forEach { $0.remove() }
        #expect(Self.inotifyInstances() == instancesBefore)
    }

    @Test("two presenters of one file share the process's watch of it: each keeps its own interests, and one removed leaves the other told")
    func presentersOfOneFile() async throws {
        let group = try TestGroup()
        let path = try makeItem(group, "item")
        let changes = ChangeCounter()
        let deletions = ChangeCounter()
        // Changes only, then deletion only: the second must not narrow what the first is told.
        let changeWatcher = try FilePresenter(presenting: path) { changes.record() }
        defer { changeWatcher.remove() }
        let deletionWatcher = try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(accommodateDeletion: { deletions.record() }))
        try await write("one", to: path)
        #expect(await changes.wait(for: 1, seconds: 60))
        deletionWatcher.remove()
        try await write("two", to: path)
        #expect(await changes.wait(for: 2, seconds: 60))
        #expect(deletions.count == 0)

        let again = try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(accommodateDeletion: { deletions.record() }))
        defer { again.remove() }
        #expect(unlink(path) == 0)
        #expect(await deletions.wait(for: 1, seconds: 60))
        try await Task.sleep(for: .milliseconds(300))
        #expect(deletions.count == 1)
        #expect(changes.count == 2)
    }

    @Test("a presenter whose didChange blocks holds up neither another presenter's didChange or answer, nor the event loop; its own calls wait their turn, in order")
    func blockedCallbackHoldsUpNobodyElse() async throws {
        let group = try TestGroup()
        let blockedPath = try makeItem(group, "blocked")
        let otherPath = try makeItem(group, "other")
        let release = DispatchSemaphore(value: 0)
        let entered = ChangeCounter()
        let running = Atomic<Int>(0)
        let overlapped = Atomic<Bool>(false)
        let blocked = try FilePresenter(presenting: blockedPath) {
            if running.add(1, ordering: .relaxed).newValue > 1 { overlapped.store(true, ordering: .relaxed) }
            defer { running.subtract(1, ordering: .relaxed) }
            entered.record()
            // Until the test says so. The test releases it on every way out (below); the limit
            // is a last resort, longer than all of the test's own waits together: once, in CI
            // on a loaded machine, the steps before the release took over 60 s, the call's
            // limit then, and the second call came in before the check that it had not.
            _ = release.wait(timeout: .now() + 600)
        }
        defer { blocked.remove() }
        // Runs before `remove()`: a test that fails early does not leave the call blocked.
        defer {
            release.signal()
            release.signal()
        }
        let otherChanges = ChangeCounter()
        let otherAsked = ChangeCounter()
        let other = try FilePresenter(presenting: otherPath, callbacks: FilePresenterCallbacks(
            didChange: { otherChanges.record() },
            relinquishToWriter: {
                otherAsked.record()
                return nil
            }
        ))
        defer { other.remove() }

        try await write("one", to: blockedPath)
        #expect(await entered.wait(for: 1, seconds: 60))
        // Another write while the call blocks: told after it, not beside it.
        try await write("two", to: blockedPath)

        // The other presenter is asked (the write waits for its answer) and told meanwhile.
        try await write("other", to: otherPath)
        #expect(otherAsked.count == 1)
        #expect(await otherChanges.wait(for: 1, seconds: 60))
        // An unrelated user of the event loop: a job, and a descriptor watched for reading.
        let loop = try EventLoop.shared()
        let loopRan = ChangeCounter()
        loop.execute { loopRan.record() }
        #expect(await loopRan.wait(for: 1, seconds: 60))
        var pipeEnds: [CInt] = [0, 0]
        #expect(pipe(&pipeEnds) == 0)
        defer { pipeEnds.forEach { Glibc.close($0) } }
        let readable = ChangeCounter()
        let readEnd = pipeEnds[0]
        let watch = try loop.watchReadable(FileDescriptor(rawValue: readEnd), label: "a test's pipe") {
            var byte: UInt8 = 0
            if Glibc.read(readEnd, &byte, 1) == 1 { readable.record() }
        }
        defer { loop.cancel(watch) }
        var byte: UInt8 = 1
        #expect(Glibc.write(pipeEnds[1], &byte, 1) == 1)
        #expect(await readable.wait(for: 1, seconds: 60))
        // All that while, the first call was still blocked.
        #expect(entered.count == 1)

        release.signal()
        #expect(await entered.wait(for: 2, seconds: 60), "the write made during the blocked call was not told after it")
        release.signal()
        let overlapping = overlapped.load(ordering: .relaxed)
        #expect(!overlapping, "two calls of one presenter ran at once")
    }

    @Test("coordinators that connect and never ask, ask garbage, or fill every conversation hold up neither the loop nor the presenter once they go")
    func hostileAskers() async throws {
        let group = try TestGroup()
        let path = try makeItem(group, "item")
        let asked = ChangeCounter()
        let presenter = try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(relinquishToWriter: {
            asked.record()
            return nil
        }))
        defer { presenter.remove() }
        let presenters = group.directory.path + "/.item.presenters"
        let socket = presenters + "/" + (try #require(try FileManager.default.contentsOfDirectory(atPath: presenters).first))
        var silent: [FileDescriptor] = []
        defer { silent.forEach { try? $0.close() } }

        // Garbage: the conversation ends (the asker sees the end of file); the presenter goes on.
        let garbage = try UnixSocket.connect(path: socket, nonBlocking: true)
        defer { try? garbage.close() }
        var junk: UInt8 = 0x5A
        #expect(send(garbage.rawValue, &junk, 1, CInt(MSG_NOSIGNAL)) == 1)
        try await withDeadline(seconds: 60, "the garbage conversation's end") {
            while true {
                var byte: UInt8 = 0
                let count = recv(garbage.rawValue, &byte, 1, CInt(MSG_DONTWAIT))
                if count == 0 || (count < 0 && errno != EAGAIN) { return }
                try await Task.sleep(for: .milliseconds(10))
            }
        }
        // One silent conversation: the presenter still answers a real coordinator.
        silent.append(try UnixSocket.connect(path: socket, nonBlocking: true))
        try await write("answered", to: path)
        #expect(asked.count == 1)

        // Every conversation taken by silent askers: a coordinator waits in the backlog and
        // times out with a typed error (never blocking the loop), ...
        while silent.count < 64 { silent.append(try UnixSocket.connect(path: socket, nonBlocking: true)) }
        await expectIPCError(.coordinationTimeout) { try await write("waits", to: path, timeout: .seconds(1)) }
        #expect(asked.count == 1)
        // ...and once they go, the presenter accepts again. (It may first answer the request the
        // coordinator that timed out left in the backlog: asked, it cannot tell.)
        silent.forEach { try? $0.close() }
        silent = []
        let before = asked.count
        try await write("answered again", to: path, timeout: .seconds(60))
        #expect(asked.count > before)
    }
}
