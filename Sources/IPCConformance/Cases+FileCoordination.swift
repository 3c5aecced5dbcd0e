public import Foundation
public import IPCCore
import Synchronization

/// Area 9: file coordination (`NSFilePresenter` and `NSFileCoordinator`), for a subject with a
/// ``FileCoordinationSystem`` (``ConformanceSubject/fileCoordination``). The other side of each
/// case is the subject's coordination peer, a process of its own (``CoordinationPeerProcess``).
enum FileCoordinationCases {
    static let all: [ConformanceCase] = [relinquishToWriter, saveAndRelinquishToReader, waitsForAnswers, killedPresenter, cancel, batch, ownPresenter, moveAndDeletion, followsMoves]

    static let relinquishToWriter = ConformanceCase(
        "9.1", "A coordinated write in another process asks this process's presenter to relinquish first and reacquire after: it sees the old contents when asked and the new ones when reacquiring",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "old")
        let seen = Mutex<[String]>([])
        let presenter = try system.present(path, FilePresenterCallbacks(relinquishToWriter: {
            seen.withLock { $0.append("relinquish:" + contents(of: path)) }
            return { seen.withLock { $0.append("reacquire:" + contents(of: path)) } }
        }))
        defer { presenter.remove() }
        let peer = try await context.coordinationPeer()
        try await runBlocking { try peer.run("write item new") }
        guard await poll(within: .seconds(10), { seen.withLock { $0.count } >= 2 }) else {
            throw ConformanceFailure("the presenter saw \(seen.withLock { $0 }) within 10 s of another process's write (expected a relinquish and a reacquire)")
        }
        try await Task.sleep(for: .milliseconds(200))
        let calls = seen.withLock { $0 }
        try check(calls == ["relinquish:old", "reacquire:new"], "the presenter saw \(calls), expected [relinquish:old, reacquire:new]")
        return .passed("relinquished with the old contents, reacquired with the new")
    }

    static let saveAndRelinquishToReader = ConformanceCase(
        "9.2", "A coordinated read in another process asks the presenter to save, then to relinquish to a reader, and reads what it saved; a save that fails refuses the read with presenterFailed",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "on disk")
        let calls = Mutex<[String]>([])
        let own = Mutex<(any FilePresentation)?>(nil)
        let presenter = try system.present(path, FilePresenterCallbacks(
            savePresentedItemChanges: {
                calls.withLock { $0.append("save") }
                try system.coordinator(own.withLock { $0 }).write(path, .seconds(10), Array("unsaved edits".utf8))
            },
            relinquishToReader: {
                calls.withLock { $0.append("relinquish") }
                return { calls.withLock { $0.append("reacquire") } }
            }
        ))
        own.withLock { $0 = presenter }
        defer { presenter.remove() }
        let peer = try await context.coordinationPeer()
        let read = try await runBlocking { try peer.run("read item") }
        try check(read == "unsaved edits", "another process read \(read.debugDescription), not what the presenter saved when asked")
        guard await poll(within: .seconds(10), { calls.withLock { $0.count } >= 3 }) else {
            throw ConformanceFailure("the presenter was called \(calls.withLock { $0 }) within 10 s of the read (expected save, relinquish, reacquire)")
        }
        try check(calls.withLock { $0 } == ["save", "relinquish", "reacquire"], "the presenter was called \(calls.withLock { $0 }), expected [save, relinquish, reacquire]")

        let refusing = try context.coordinatedFile("refusing", contents: "kept")
        let failing = try system.present(refusing, FilePresenterCallbacks(savePresentedItemChanges: {
            throw IPCError(code: .transportFailure, message: "this save fails")
        }))
        defer { failing.remove() }
        let refusal = try await runBlocking { () -> String in
            peer.start("read refusing")
            return try peer.answer()
        }
        try check(refusal.hasPrefix("ERR presenterFailed"), "a read whose presenter could not save answered \(refusal.debugDescription), expected ERR presenterFailed")
        return .passed("save, relinquish, reacquire in order; the saved contents read; a failed save refuses the read")
    }

    static let waitsForAnswers = ConformanceCase(
        "9.3", "An access waits for the presenter's answer: a write in another process lands only after a presenter that takes 300 ms has answered; a presenter that never answers fails an access with coordinationTimeout within its timeout, the file unchanged",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("slow", contents: "old")
        let seenAfterPause = Mutex<String?>(nil)
        let presenter = try system.present(path, FilePresenterCallbacks(relinquishToWriter: {
            // blocking-call-check: allowed (the presenter's dispatch queue runs this callback, not the case's task)
            Thread.sleep(forTimeInterval: 0.3)
            seenAfterPause.withLock { $0 = contents(of: path) }
            return nil
        }))
        defer { presenter.remove() }
        let peer = try await context.coordinationPeer()
        try await runBlocking { try peer.run("write slow new") }
        try check(seenAfterPause.withLock { $0 } == "old", "300 ms into its answer the presenter saw \(seenAfterPause.withLock { $0 }.debugDescription): the write did not wait")
        try check(contents(of: path) == "new", "the write did not land after the presenter answered")

        let stuck = try context.coordinatedFile("stuck", contents: "untouched")
        try await runBlocking { try peer.run("present stuck hang") }
        let started = ContinuousClock.now
        let coordinator = system.coordinator(nil)
        let task = Task { try await runBlocking { try coordinator.write(stuck, .seconds(1), Array("changed".utf8)) } }
        guard let outcome = await result(of: task, within: .seconds(10)) else {
            coordinator.cancel()
            throw ConformanceFailure("a write with a 1 s timeout waited more than 10 s for a presenter that never answers")
        }
        let waited = ContinuousClock.now - started
        context.record("unanswered write failed after (ms)", Double(waited.components.seconds) * 1000 + Double(waited.components.attoseconds) / 1e15)
        guard case .failure(let error) = outcome, (error as? IPCError)?.code == .coordinationTimeout else {
            throw ConformanceFailure("a write whose presenter never answers gave \(outcome), expected coordinationTimeout")
        }
        try check(contents(of: stuck) == "untouched", "the write that timed out changed the file")
        return .passed("waited for a 300 ms answer; an unanswered write failed with coordinationTimeout")
    }

    static let killedPresenter = ConformanceCase(
        "9.4", "A presenter process killed with SIGKILL while it holds a relinquish does not block the write waiting for it: the write goes on within the invalidation deadline",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "old")
        let peer = try await context.coordinationPeer()
        try await runBlocking { try peer.run("present item hang") }
        let coordinator = system.coordinator(nil)
        let task = Task { try await runBlocking { try coordinator.write(path, .seconds(60), Array("new".utf8)) } }
        guard await peer.events(within: .seconds(10), until: { $0.contains("item:relinquish-writer") }) != nil else {
            coordinator.cancel()
            throw ConformanceFailure("the write in this process did not ask the peer's presenter within 10 s")
        }
        let killed = ContinuousClock.now
        try await runBlocking { peer.kill() }
        guard let outcome = await result(of: task, within: context.deadline) else {
            coordinator.cancel()
            throw ConformanceFailure("the write was still waiting \(context.deadline) after its presenter was killed")
        }
        let waited = ContinuousClock.now - killed
        context.record("kill to write done (ms)", Double(waited.components.seconds) * 1000 + Double(waited.components.attoseconds) / 1e15)
        if case .failure(let error) = outcome { throw ConformanceFailure("the write failed after its presenter was killed: \(error)") }
        try check(contents(of: path) == "new", "the write did not land")
        try await runBlocking { try coordinator.write(path, .seconds(10), Array("again".utf8)) }
        return .passed("the write went on after the kill")
    }

    static let cancel = ConformanceCase(
        "9.5", "cancel() fails a coordinated write waiting for a lock held by another process with CancellationError promptly; the coordinator's next access works",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "old")
        let peer = try await context.coordinationPeer()
        try await runBlocking { try peer.run("hold-write item") }
        let coordinator = system.coordinator(nil)
        let task = Task { try await runBlocking { try coordinator.write(path, .seconds(60), Array("cancelled".utf8)) } }
        try await Task.sleep(for: .milliseconds(200))
        coordinator.cancel()
        guard let outcome = await result(of: task, within: .seconds(5)) else {
            _ = try? await runBlocking { try peer.run("release") }
            throw ConformanceFailure("a cancelled write was still waiting 5 s after cancel()")
        }
        guard case .failure(let error) = outcome, error is CancellationError else {
            throw ConformanceFailure("a cancelled write gave \(outcome), expected CancellationError")
        }
        try await runBlocking { try peer.run("release") }
        try check(contents(of: path) == "old", "the cancelled write changed the file")
        try await runBlocking { try coordinator.write(path, .seconds(10), Array("after".utf8)) }
        try check(contents(of: path) == "after", "the coordinator's next write did not land")
        return .passed("cancelled with CancellationError; the next write landed")
    }

    static let batch = ConformanceCase(
        "9.6", "A batch (prepare) of three writes to each of two files asks each file's presenter in another process once, and it reacquires once, after the batch",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let first = try context.coordinatedFile("first", contents: "old")
        let second = try context.coordinatedFile("second", contents: "old")
        let peer = try await context.coordinationPeer()
        try await runBlocking {
            try peer.run("present first answer")
            try peer.run("present second answer")
        }
        let coordinator = system.coordinator(nil)
        try await runBlocking {
            try coordinator.prepareWriting([first, second], .seconds(10)) {
                for index in 0..<3 {
                    for path in [first, second] { try coordinator.write(path, .seconds(10), Array("batch \(index)".utf8)) }
                }
            }
        }
        let kinds = ["relinquish-writer", "reacquire-writer"]
        @Sendable func counts(_ events: [String]) -> [String: Int] {
            Dictionary(events.filter { event in kinds.contains { event.hasSuffix(":" + $0) } }.map { ($0, 1) }, uniquingKeysWith: +)
        }
        _ = await peer.events(within: .seconds(10)) { counts($0).count == 4 }
        try await Task.sleep(for: .milliseconds(200))
        let seen = counts(await peer.events(within: .seconds(10)) { _ in true } ?? [])
        let expected = Dictionary(uniqueKeysWithValues: ["first", "second"].flatMap { file in kinds.map { ("\(file):\($0)", 1) } })
        try check(seen == expected, "the peer's presenters saw \(seen.sorted { $0.key < $1.key }), expected each relinquish and reacquire once")
        try check(contents(of: first) == "batch 2" && contents(of: second) == "batch 2", "the batch's writes did not land")
        return .passed("6 writes in one batch: each presenter relinquished and reacquired once")
    }

    static let ownPresenter = ConformanceCase(
        "9.7", "A coordinator made with a presenter neither asks nor tells that presenter about its own writes; a coordinator without it does both",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "old")
        let asked = Mutex(0)
        let told = Mutex(0)
        let presenter = try system.present(path, FilePresenterCallbacks(
            didChange: { told.withLock { $0 += 1 } },
            relinquishToWriter: {
                asked.withLock { $0 += 1 }
                return nil
            }
        ))
        defer { presenter.remove() }
        try await runBlocking { try system.coordinator(presenter).write(path, .seconds(10), Array("own".utf8)) }
        try await Task.sleep(for: .milliseconds(300))
        try check(asked.withLock { $0 } == 0 && told.withLock { $0 } == 0, "its own coordinator's write asked the presenter \(asked.withLock { $0 }) times and told it \(told.withLock { $0 }) times")
        try await runBlocking { try system.coordinator(nil).write(path, .seconds(10), Array("other".utf8)) }
        guard await poll(within: .seconds(10), { asked.withLock { $0 } == 1 && told.withLock { $0 } >= 1 }) else {
            throw ConformanceFailure("another coordinator's write asked the presenter \(asked.withLock { $0 }) times and told it \(told.withLock { $0 }) times (expected 1 and at least 1)")
        }
        return .passed("its own writes: not asked, not told; another coordinator's: asked once, told")
    }

    static let moveAndDeletion = ConformanceCase(
        "9.8", "A presenter is told the new path when another process renames the file, and told once when another process removes its last name",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "kept")
        let moves = Mutex<[String]>([])
        let deletions = Mutex(0)
        let presenter = try system.present(path, FilePresenterCallbacks(
            didMove: { newPath in moves.withLock { $0.append(newPath) } },
            accommodateDeletion: { deletions.withLock { $0 += 1 } }
        ))
        defer { presenter.remove() }
        let peer = try await context.coordinationPeer()
        try await runBlocking { try peer.run("rename item renamed") }
        let renamed = context.group.path + "/renamed"
        guard await poll(within: .seconds(10), { moves.withLock { $0 }.last.map { URL(fileURLWithPath: $0).standardizedFileURL.path == URL(fileURLWithPath: renamed).standardizedFileURL.path } ?? false }) else {
            throw ConformanceFailure("a rename by another process to \(renamed) gave the moves \(moves.withLock { $0 }) within 10 s")
        }
        try await runBlocking { try peer.run("remove renamed") }
        guard await poll(within: .seconds(10), { deletions.withLock { $0 } > 0 }) else {
            throw ConformanceFailure("removing the file's last name in another process was not told within 10 s")
        }
        try await Task.sleep(for: .milliseconds(300))
        try check(deletions.withLock { $0 } == 1, "the deletion was told \(deletions.withLock { $0 }) times")
        try check(moves.withLock { $0 }.count == 1, "one rename was told \(moves.withLock { $0 }.count) times")
        return .passed("told the new path once, and the deletion once")
    }
}

extension FileCoordinationCases {
    static let followsMoves = ConformanceCase(
        "9.9", "A presenter follows renames by another process, within the directory and into another: its path is the new one, a coordinated write at the new path asks it to relinquish, and one at the old path no longer does",
        requires: .fileCoordination
    ) { context in
        let system = try context.fileCoordination()
        let path = try context.coordinatedFile("item", contents: "first")
        let asked = Mutex(0)
        let moves = Mutex<[String]>([])
        let presenter = try system.present(path, FilePresenterCallbacks(
            didMove: { newPath in moves.withLock { $0.append(newPath) } },
            relinquishToWriter: {
                asked.withLock { $0 += 1 }
                return nil
            }
        ))
        defer { presenter.remove() }
        let peer = try await context.coordinationPeer()
        let elsewhere = context.group.path + "/elsewhere"
        guard mkdir(elsewhere, 0o700) == 0 else { throw IPCError(code: .transportFailure, message: "cannot create \(elsewhere)") }
        let steps: [(command: String, name: String, path: String)] = [
            ("rename item renamed", "renamed", context.group.path + "/renamed"),
            ("rename renamed elsewhere/moved", "elsewhere/moved", elsewhere + "/moved"),
        ]
        var previous = "item"
        for (index, step) in steps.enumerated() {
            try await runBlocking { try peer.run(step.command) }
            let expected = URL(fileURLWithPath: step.path).standardizedFileURL.path
            // didMove runs after the path follows.
            guard await poll(within: .seconds(10), { moves.withLock { $0.count } > index }) else {
                throw ConformanceFailure("after \(step.command.debugDescription) by another process the presenter was told no move within 10 s (told \(moves.withLock { $0 }))")
            }
            let now = URL(fileURLWithPath: presenter.path).standardizedFileURL.path
            try check(now == expected, "after \(step.command.debugDescription) by another process the presenter's path is \(presenter.path), expected \(expected)")
            // A coordinated write at the new path, in another process, asks it first.
            let before = asked.withLock { $0 }
            let name = step.name
            try await runBlocking { _ = try peer.run("write \(name) written-\(index)") }
            try check(asked.withLock { $0 } == before + 1, "a coordinated write at the new path \(step.path) in another process asked the presenter \(asked.withLock { $0 } - before) times (expected once)")
            // One at the old path (a new file there) does not.
            let old = previous
            try await runBlocking { _ = try peer.run("write \(old) new-file") }
            try check(asked.withLock { $0 } == before + 1, "a coordinated write at the old path, a new file, asked the presenter of the moved file")
            try await runBlocking { _ = try peer.run("remove \(old)") }
            previous = name
        }
        return .passed("followed a rename and a move into another directory: the path is the new one, asked at the new path, not at the old")
    }
}

/// The file's contents as text, read without coordination ("" if it cannot be read).
private func contents(of path: String) -> String {
    FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } ?? ""
}

extension CoordinationPeerProcess {
    /// The peer's presenter events once `condition` holds for them, asked every 10 ms on a
    /// thread of its own (an answer is waited for, never on the cooperative pool); `nil` if it
    /// did not hold within `limit`.
    func events(within limit: Duration, until condition: @escaping @Sendable ([String]) -> Bool) async -> [String]? {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            let events = (try? await runBlocking { try self.run("events") })?.split(separator: " ").map(String.init) ?? []
            if condition(events) { return events }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return nil
    }
}

extension CaseContext {
    /// The subject's file coordination.
    func fileCoordination() throws -> ErasedFileCoordination {
        subject.fileCoordination!.system
    }

    /// Creates the file `name` in the case's group with `contents`; returns its path.
    func coordinatedFile(_ name: String, contents: String) throws -> String {
        let path = group.path + "/" + name
        guard FileManager.default.createFile(atPath: path, contents: Data(contents.utf8)) else {
            throw IPCError(code: .transportFailure, message: "cannot create \(path)")
        }
        return path
    }

    /// Starts the subject's coordination peer for this case's group; it is killed when the case ends.
    func coordinationPeer() async throws -> CoordinationPeerProcess {
        let access = subject.fileCoordination!
        let peer = try await runBlocking { try CoordinationPeerProcess(executable: access.peer, arguments: access.peerArguments + ["--group", self.group.path]) }
        onTearDown { peer.kill() }
        return peer
    }
}

/// How the file-coordination cases (area 9) reach a ``FileCoordinationSystem``: the system in
/// this process, and a program that coordinates and presents from another process (the
/// contract of ``CoordinationPeerProcess``), run with ``peerArguments`` and then `--group DIR`.
public struct FileCoordinationAccess: Sendable {
    public var peer: URL
    public var peerArguments: [String]
    let system: ErasedFileCoordination

    public init<System: FileCoordinationSystem>(peer: URL, peerArguments: [String] = [], system: System) {
        self.peer = peer
        self.peerArguments = peerArguments
        self.system = ErasedFileCoordination(system)
    }
}

/// A ``FileCoordinationSystem`` of any type, for the cases.
struct ErasedFileCoordination: Sendable {
    let present: @Sendable (String, FilePresenterCallbacks) throws -> any FilePresentation
    let coordinator: @Sendable ((any FilePresentation)?) -> ErasedCoordinator

    init<System: FileCoordinationSystem>(_ system: System) {
        present = { try system.present($0, callbacks: $1) }
        coordinator = { presenter in ErasedCoordinator(system.coordinator(filePresenter: presenter as? System.Presenter)) }
    }
}

/// A ``FileCoordinating`` of any type, for the cases.
struct ErasedCoordinator: Sendable {
    let read: @Sendable (String, Duration) throws -> [UInt8]
    let write: @Sendable (String, Duration, [UInt8]) throws -> Void
    let prepareWriting: @Sendable ([String], Duration, () throws -> Void) throws -> Void
    let cancel: @Sendable () -> Void

    init<Coordinator: FileCoordinating>(_ coordinator: Coordinator) {
        read = { path, timeout in try coordinator.coordinate(readingItemAt: path, timeout: timeout) { try $0.contents() } }
        write = { path, timeout, bytes in try coordinator.coordinate(writingItemAt: path, timeout: timeout) { try $0.replaceContents(with: bytes) } }
        prepareWriting = { paths, timeout, batch in try coordinator.prepare(forReadingItemsAt: [], writingItemsAt: paths, timeout: timeout, byAccessor: batch) }
        cancel = { coordinator.cancel() }
    }
}
