import FilePresenterTransport
import IPCFileCoordination
import Foundation
import IPCCore
import IPCTestSupport
import Synchronization
import Testing
import IPCConformance

/// Change notification: what a presenter is told, and what it is not.
///
/// "Not told" is checked by waiting a while (half a second) after the change and then making a
/// change that must be reported: a presenter that reported the first would have done so long
/// before the second arrives.
@Suite("File presenter: presentation")
struct FilePresenterTests {
    private func makeItem(_ group: borrowing TestGroup) throws -> String {
        let path = group.directory.path + "/item"
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("start".utf8)) }
        return path
    }

    @Test("a rename by another process is told with the new path, an unlink once as a deletion; a touch is neither")
    func moveAndDeletion() async throws {
        let group = try TestGroup()
        let path = try makeItem(group)
        let moves = Mutex<[String]>([])
        let deletions = Mutex(0)
        let presenter = try FilePresenter(
            presenting: path, didChange: {},
            didMove: { newPath in moves.withLock { $0.append(newPath) } },
            accommodateDeletion: { deletions.withLock { $0 += 1 } }
        )
        defer { presenter.remove() }
        func run(_ tool: String, _ arguments: [String]) throws {
            let process = try Process.run(URL(fileURLWithPath: tool), arguments: arguments)
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
        }
        try run("/usr/bin/touch", [path])
        let renamed = group.directory.path + "/renamed"
        try run("/bin/mv", [path, renamed])
        try await withDeadline(seconds: 30, "the move") {
            while moves.withLock({ $0.isEmpty }) { try await Task.sleep(for: .milliseconds(10)) }
        }
        let second = group.directory.path + "/second name"
        try run("/bin/mv", [renamed, second])
        try await withDeadline(seconds: 30, "the second move") {
            while moves.withLock({ $0.count }) < 2 { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(moves.withLock { $0 } == [renamed, second])
        #expect(deletions.withLock { $0 } == 0)
        try run("/bin/rm", [second])
        try await withDeadline(seconds: 30, "the deletion") {
            while deletions.withLock({ $0 }) == 0 { try await Task.sleep(for: .milliseconds(10)) }
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(deletions.withLock { $0 } == 1)
        #expect(moves.withLock { $0.count } == 2)
    }

    @Test("another process's coordinated write is reported; a touch, a chmod and the presenter's own writes are not")
    func changeNotificationAndFiltering() async throws {
        let group = try TestGroup()
        let path = try makeItem(group)
        let changes = ChangeCounter()
        let presenter = try FilePresenter(presenting: path) { changes.record() }
        defer { presenter.remove() }
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        // Attribute-only changes, one of them from another process (touch opens the file for
        // writing, so a presenter that listened for close-after-write would report it).
        let touch = try Process.run(URL(fileURLWithPath: "/usr/bin/touch"), arguments: [path])
        touch.waitUntilExit()
        #expect(touch.terminationStatus == 0)
        #expect(chmod(path, 0o640) == 0)
        // The presenter's own coordinated writes, including a truncation.
        let own = FileCoordinator(filePresenter: presenter)
        for text in ["mine", "mine, longer", ""] {
            try own.coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array(text.utf8)) }
        }
        try await Task.sleep(for: .milliseconds(500))
        #expect(changes.count == 0)

        // Another process writes: reported.
        try await peer.run("write item theirs")
        #expect(await changes.wait(for: 1))
        // Another coordinator in this process is someone else too.
        try FileCoordinator().coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("ours".utf8)) }
        #expect(await changes.wait(for: 2))
        // Own writes right after foreign ones are still told apart.
        try own.coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("mine again".utf8)) }
        try await peer.run("write item theirs-again")
        #expect(await changes.wait(for: 3))
        try await Task.sleep(for: .milliseconds(500))
        #expect(changes.count == 3)
    }

    @Test("a removed presenter is told nothing, while another presenter of the same file is")
    func removal() async throws {
        let group = try TestGroup()
        let path = try makeItem(group)
        let removedChanges = ChangeCounter()
        let witnessChanges = ChangeCounter()
        let removed = try FilePresenter(presenting: path) { removedChanges.record() }
        let witness = try FilePresenter(presenting: path) { witnessChanges.record() }
        defer { witness.remove() }
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        try await peer.run("write item one")
        #expect(await removedChanges.wait(for: 1))
        #expect(await witnessChanges.wait(for: 1))
        removed.remove()
        removed.remove()
        try await peer.run("write item two")
        #expect(await witnessChanges.wait(for: 2))
        try await Task.sleep(for: .milliseconds(300))
        #expect(removedChanges.count == 1)
    }

    @Test("a presenter removed from inside its own callback is told nothing more")
    func removalFromTheCallback() async throws {
        let group = try TestGroup()
        let path = try makeItem(group)
        let changes = ChangeCounter()
        let witnessChanges = ChangeCounter()
        let box = Mutex<FilePresenter?>(nil)
        let presenter = try FilePresenter(presenting: path) {
            changes.record()
            box.withLock { $0 }?.remove()
        }
        box.withLock { $0 = presenter }
        let witness = try FilePresenter(presenting: path) { witnessChanges.record() }
        defer { witness.remove() }
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        for (index, text) in ["one", "two", "three"].enumerated() {
            try await peer.run("write item \(text)")
            #expect(await witnessChanges.wait(for: index + 1))
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(changes.count == 1)
        box.withLock { $0 = nil }
    }

    @Test("remove() from another thread waits for a callback in progress, and none starts afterwards")
    func removalWaitsForARunningCallback() async throws {
        let group = try TestGroup()
        let path = try makeItem(group)
        let entered = ChangeCounter()
        let finished = Atomic<Bool>(false)
        let calls = Atomic<Int>(0)
        let presenter = try FilePresenter(presenting: path) {
            guard calls.add(1, ordering: .relaxed).newValue == 1 else { return }
            entered.record()
            Thread.sleep(forTimeInterval: 0.3)
            finished.store(true, ordering: .relaxed)
        }
        let witnessChanges = ChangeCounter()
        let witness = try FilePresenter(presenting: path) { witnessChanges.record() }
        defer { witness.remove() }
        let peer = try CoordinationPeer(group: group.directory)
        defer { peer.stop() }

        try await peer.run("write item one")
        #expect(await entered.wait(for: 1))
        presenter.remove()
        let callbackFinished = finished.load(ordering: .relaxed)
        #expect(callbackFinished)
        try await peer.run("write item two")
        #expect(await witnessChanges.wait(for: 2))
        try await Task.sleep(for: .milliseconds(300))
        let callCount = calls.load(ordering: .relaxed)
        #expect(callCount == 1)
    }

    @Test("presenting a file that does not exist is a typed error")
    func missingFile() async throws {
        let group = try TestGroup()
        await expectIPCError(.transportFailure) { try FilePresenter(presenting: group.directory.path + "/missing") {} }
    }
}
