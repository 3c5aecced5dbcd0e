import FilePresenterTransport
import IPCFileCoordination
import Foundation
import IPCCore
import IPCSystem
import IPCTestSupport
import Synchronization
import SystemPackage
import Testing
import IPCConformance

/// Presenters that answer coordinators, against what another process of the same user (or
/// another user) can put in a file's presenters directory. The rules every implementation
/// keeps are conformance area 9; these are this implementation's own defences.
@Suite("File presenter: answering coordinators")
struct PresenterAnsweringTests {
    private func makeItem(_ group: borrowing TestGroup) throws -> (path: String, presenters: String) {
        let path = group.directory.path + "/item"
        // Nobody presents it yet: nothing to wait for.
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("start".utf8)) }
        return (path, group.directory.path + "/.item.presenters")
    }

    /// A coordinated write, on a thread of its own (`runBlocking`): it waits for presenters.
    private func write(_ text: String, to path: String, timeout: Duration = .seconds(10), coordinator: FileCoordinator = FileCoordinator()) async throws {
        try await runBlocking { try coordinator.coordinate(writingItemAt: path, timeout: timeout) { try $0.replaceContents(with: Array(text.utf8)) } }
    }

    @Test("a presenters directory that is a link, another user's, or open to others refuses the access with accessDenied")
    func untrustedDirectory() async throws {
        let group = try TestGroup()
        let (path, presenters) = try makeItem(group)
        let elsewhere = group.directory.path + "/elsewhere"
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        #expect(symlink(elsewhere, presenters) == 0)
        await expectIPCError(.accessDenied) { try await write("linked", to: path) }
        await expectIPCError(.accessDenied) { try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(relinquishToWriter: { nil })) }
        unlink(presenters)

        try FileManager.default.createDirectory(atPath: presenters, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o777])
        chmod(presenters, 0o777)
        await expectIPCError(.accessDenied) { try await write("open", to: path) }
        chmod(presenters, 0o700)
        if geteuid() == 0 {
            #expect(chown(presenters, 65534, 65534) == 0)
            await expectIPCError(.accessDenied) { try await write("foreign", to: path) }
            #expect(chown(presenters, 0, 0) == 0)
        }
        try await write("trusted", to: path)
        #expect(String(decoding: FileManager.default.contents(atPath: path)!, as: UTF8.self) == "trusted")
    }

    @Test("junk in the directory is ignored and a dead presenter's socket removed; a presenter that hangs up unasked is not waited for")
    func junkAndStaleSockets() async throws {
        let group = try TestGroup()
        let (path, presenters) = try makeItem(group)
        let presenter = try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(relinquishToWriter: { nil }))
        defer { presenter.remove() }
        // A regular file and a directory with presenter-like names, and an unrelated name.
        #expect(FileManager.default.createFile(atPath: presenters + "/1.2", contents: Data("x".utf8)))
        try FileManager.default.createDirectory(atPath: presenters + "/3.4", withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: presenters + "/notes", contents: Data()))
        // A socket nobody listens on any more.
        let stale = try UnixSocket.listen(path: presenters + "/999999.1")
        try? stale.close()
        // A socket whose listener accepts and hangs up without answering.
        let rude = try UnixSocket.listen(path: presenters + "/999999.2")
        // Until the test is over, however late a loaded machine lets the access run.
        let over = Atomic<Bool>(false)
        let hangUps = Thread {
            while !over.load(ordering: .relaxed) {
                if case .accepted(let fd) = (try? UnixSocket.acceptIfReady(rude)) ?? .none { try? fd.close() }
                usleep(10_000)
            }
        }
        hangUps.start()
        defer { over.store(true, ordering: .relaxed) }
        try await write("through", to: path)
        #expect(!FileManager.default.fileExists(atPath: presenters + "/999999.1"), "the dead presenter's socket was not removed")
        for name in ["1.2", "3.4", "notes", "999999.2"] {
            #expect(FileManager.default.fileExists(atPath: presenters + "/" + name), "\(name) was removed")
        }
        try? rude.close()
    }

    @Test("a presenter that answers garbage refuses the access with presenterFailed")
    func garbageAnswer() async throws {
        let group = try TestGroup()
        let (path, presenters) = try makeItem(group)
        try FileManager.default.createDirectory(atPath: presenters, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let liar = try UnixSocket.listen(path: presenters + "/999999.3")
        defer { try? liar.close() }
        // Until the test is over, however late a loaded machine lets the access run.
        let over = Atomic<Bool>(false)
        defer { over.store(true, ordering: .relaxed) }
        let answering = Thread {
            while !over.load(ordering: .relaxed) {
                if case .accepted(let fd) = (try? UnixSocket.acceptIfReady(liar)) ?? .none {
                    var garbage: UInt8 = 0x5A
                    _ = send(fd.rawValue, &garbage, 1, CInt(MSG_NOSIGNAL))
                    usleep(100_000)
                    try? fd.close()
                    return
                }
                usleep(10_000)
            }
        }
        answering.start()
        await expectIPCError(.presenterFailed) { try await write("refused", to: path) }
        #expect(String(decoding: FileManager.default.contents(atPath: path)!, as: UTF8.self) == "start")
    }

    @Test("a socket whose listener never accepts and whose backlog is full fails the access with coordinationTimeout at once, never a blocked connect")
    func fullBacklog() async throws {
        let group = try TestGroup()
        let (path, presenters) = try makeItem(group)
        try FileManager.default.createDirectory(atPath: presenters, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let socketPath = presenters + "/999999.4"
        let squatter = try UnixSocket.listen(path: socketPath, backlog: 0)
        defer { try? squatter.close() }
        var fillers: [FileDescriptor] = []
        defer { fillers.forEach { try? $0.close() } }
        while fillers.count < 16, let filler = try? UnixSocket.connect(path: socketPath, nonBlocking: true) { fillers.append(filler) }
        #expect(fillers.count < 16, "the backlog never filled")
        await expectIPCError(.coordinationTimeout) { try await write("blocked", to: path, timeout: .seconds(60)) }
        #expect(String(decoding: FileManager.default.contents(atPath: path)!, as: UTF8.self) == "start")
    }

    @Test("cancel() ends a write waiting for a presenter in another process that never answers; remove() takes a presenter's socket away")
    func cancelWhileAskingAndRemove() async throws {
        let group = try TestGroup()
        let (path, presenters) = try makeItem(group)
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.kill() }
        try await peer.run("present item hang")
        let coordinator = FileCoordinator()
        let outcome = Mutex<Result<Void, any Error>?>(nil)
        Thread.detachNewThread {
            let result = Result { try coordinator.coordinate(writingItemAt: path, timeout: .seconds(120)) { try $0.replaceContents(with: Array("never".utf8)) } }
            outcome.withLock { $0 = result }
        }
        try await Task.sleep(for: .milliseconds(300))
        coordinator.cancel()
        let deadline = ContinuousClock.now + .seconds(30)
        while outcome.withLock({ $0 == nil }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        let result = try #require(outcome.withLock { $0 })
        #expect(throws: CancellationError.self) { try result.get() }

        let local = try FilePresenter(presenting: path, callbacks: FilePresenterCallbacks(relinquishToWriter: { nil }))
        let before = try FileManager.default.contentsOfDirectory(atPath: presenters).count
        local.remove()
        #expect(try FileManager.default.contentsOfDirectory(atPath: presenters).count == before - 1)
    }
}
