import CIPCShims
import Glibc
package import IPCCore
import IPCFileCoordination
import IPCFraming
import Synchronization
import SystemPackage
import IPCSystem

/// The far side of the file coordination tests: runs coordinated operations in its own process,
/// one command per line of standard input, so a test can hold a lock, write, or die mid-write
/// in a second process. `ipcbench peer --transport file-presenter --role coordinator` runs it.
///
/// It prints `READY <pid>` first, then one line per command: `OK` (with a result) or `ERR <why>`.
/// Files are named relative to the group directory: `name` or `directory/name` (one level of
/// subdirectory, which must exist), each part a valid endpoint name.
///
/// | command | effect |
/// |---|---|
/// | `write <file> <text>` | a coordinated write that makes `text` the file's contents |
/// | `read <file>` | a coordinated read; answers `OK <contents>` |
/// | `hold-write <file>`, `hold-read <file>` | takes the file's exclusive or shared lock and keeps it |
/// | `release` | gives back the held lock |
/// | `write-halves <file> <count>` | `count` coordinated writes of 4 KiB, each one letter, written in two halves 1 ms apart |
/// | `tear <endpoint>` | connects to the endpoint, then, holding its outbox's lock, writes part of a record and stops, to be killed (or stopped) |
/// | `write-within <file> <milliseconds> <text>` | `write` with that timeout |
/// | `rename <file> <new name>`, `remove <file>` | renames the file, removes its name |
/// | `present <file> <behaviour>` | presents the file, answering coordinators: `answer` (at once), `slow=<ms>` (relinquishes after that long), `hang` (never answers), `save=<text>` (saves `text` with a coordinated write of its own when asked), `fail-save` (its save fails) |
/// | `events` | answers `OK` and the presenters' events so far, in order, separated by spaces: `<file>:save`, `<file>:relinquish-reader`, `<file>:reacquire-reader`, `<file>:relinquish-writer`, `<file>:reacquire-writer`, `<file>:changed` |
/// | `prepare-write <file>,<file>... <count>` | one batch for writing the files, in which it makes `count` coordinated writes to each |
///
/// This is the program contract of the conformance suite's area 9 (`FileCoordinationAccess`):
/// another implementation's peer answers the same commands.
package struct FileCoordinationPeer {
    package let group: GroupDirectory
    private var held: CoordinatedFile?
    private var presenters: [FilePresenter] = []
    private let events = EventLog()
    /// Kept open until the process ends, as a client that dies mid-write would keep it.
    private var connection: FilePresenterConnection?

    package init(group: GroupDirectory) {
        self.group = group
    }

    /// Runs commands until standard input closes.
    package mutating func run() {
        answer("READY \(getpid())")
        while let line = readLine() {
            let words = line.split(separator: " ", maxSplits: 2).map(String.init)
            do {
                answer("OK" + (try perform(words).map { " " + $0 } ?? ""))
            } catch {
                answer("ERR \(error)")
            }
        }
    }

    private mutating func perform(_ words: [String]) throws -> String? {
        let coordinator = FileCoordinator()
        switch (words.first ?? "", words.count) {
        case ("write", 3):
            try coordinator.coordinate(writingItemAt: try path(words[1]), timeout: .seconds(10)) { try $0.replaceContents(with: Array(words[2].utf8)) }
        case ("read", 2):
            return try coordinator.coordinate(readingItemAt: try path(words[1]), timeout: .seconds(10)) { String(decoding: try $0.read(), as: UTF8.self) }
        case ("hold-write", 2), ("hold-read", 2):
            let file = try CoordinatedFile(path: try path(words[1]))
            try file.lock(exclusive: words[0] == "hold-write", timeout: .seconds(10))
            held = file
        case ("release", 1):
            held?.unlock()
            held = nil
        case ("write-halves", 3):
            let file = try CoordinatedFile(path: try path(words[1]))
            for index in 0..<(Int(words[2]) ?? 0) {
                let half = [UInt8](repeating: UInt8(ascii: "a") + UInt8(index % 26), count: 2048)
                try coordinator.coordinate(writingItem: file, timeout: .seconds(10)) { access in
                    try access.write(half, at: 0)
                    var pause = timespec(tv_sec: 0, tv_nsec: 1_000_000)
                    nanosleep(&pause, nil)
                    try access.write(half, at: half.count)
                }
            }
        case ("tear", 2):
            let endpoint = try Endpoint(group: group, name: words[1])
            connection = try FilePresenterTransport().connect(to: endpoint, options: .defaults)
            guard let outboxPath = connection?.outboxPath else { throw IPCError(code: .transportFailure, message: "a file-presenter connection without an outbox") }
            let inbox = try CoordinatedFile(path: outboxPath, create: false)
            try inbox.lock(exclusive: true, timeout: .seconds(10))
            held = inbox
            let header = try Journal.readHeader(FileAccess(file: inbox, isWriting: true))
            // A record that announces 1000 payload bytes, cut off after 10 of them.
            var partial = RecordHeader(kind: .frame, sender: SenderID(pid: getpid(), serial: 0)).bytes
            try BinaryFrameEncoder(maximumPayloadLength: 1000).encodeHeader(FrameHeader(kind: .message, msgid: 9, correlation: 0, payloadLength: 1000), into: &partial)
            partial += [UInt8](repeating: 0xEE, count: 10)
            try FileAccess(file: inbox, isWriting: true).write(partial, at: header.committedEnd)
        case ("write-within", 3):
            let parts = words[2].split(separator: " ", maxSplits: 1).map(String.init)
            guard parts.count == 2, let milliseconds = Int(parts[0]) else { throw IPCError(code: .unsupportedOperation, message: "write-within <file> <milliseconds> <text>") }
            try coordinator.coordinate(writingItemAt: try path(words[1]), timeout: .milliseconds(milliseconds)) { try $0.replaceContents(with: Array(parts[1].utf8)) }
        case ("rename", 3):
            guard rename(try path(words[1]), try path(words[2])) == 0 else { throw IPCError.syscall("rename", Errno(rawValue: errno)) }
        case ("remove", 2):
            guard unlink(try path(words[1])) == 0 else { throw IPCError.syscall("unlink", Errno(rawValue: errno)) }
        case ("present", 3):
            presenters.append(try present(words[1], behaviour: words[2]))
        case ("events", 1):
            return events.entries.withLock { $0.joined(separator: " ") }
        case ("prepare-write", 3):
            guard let count = Int(words[2]) else { throw IPCError(code: .unsupportedOperation, message: "prepare-write <file>,<file>... <count>") }
            let paths = try words[1].split(separator: ",").map { try path(String($0)) }
            try coordinator.prepare(forReadingItemsAt: [], writingItemsAt: paths, timeout: .seconds(10)) {
                for index in 0..<count {
                    for path in paths {
                        try coordinator.coordinate(writingItemAt: path, timeout: .seconds(10)) { try $0.replaceContents(with: Array("batch \(index)".utf8)) }
                    }
                }
            }
        default:
            throw IPCError(code: .unsupportedOperation, message: "unknown command \(words.joined(separator: " ").debugDescription)")
        }
        return nil
    }

    /// A presenter of `name` that records what it is told and answers as `behaviour` says.
    private func present(_ name: String, behaviour: String) throws -> FilePresenter {
        let events = events
        let record: @Sendable (String) -> Void = { event in events.entries.withLock { $0.append(name + ":" + event) } }
        let delay: Int
        switch behaviour {
        case "answer", "fail-save": delay = 0
        case "hang": delay = -1
        default:
            if behaviour.hasPrefix("slow="), let milliseconds = Int(behaviour.dropFirst(5)), milliseconds >= 0 {
                delay = milliseconds
            } else if behaviour.hasPrefix("save=") {
                delay = 0
            } else {
                throw IPCError(code: .unsupportedOperation, message: "unknown presenter behaviour \(behaviour.debugDescription)")
            }
        }
        let relinquish: @Sendable (String) -> FilePresenterCallbacks.Reacquirer = { kind in
            record("relinquish-" + kind)
            if delay < 0 {
                while true { pause() }
            }
            var interval = timespec(tv_sec: delay / 1000, tv_nsec: (delay % 1000) * 1_000_000)
            nanosleep(&interval, nil)
            return { record("reacquire-" + kind) }
        }
        let path = try path(name)
        let saved = behaviour.hasPrefix("save=") ? String(behaviour.dropFirst(5)) : nil
        // Its own presenter, for its own saving write. (A cycle: the peer's presenters live as
        // long as its process.)
        let presenter = PresenterBox()
        let callbacks = FilePresenterCallbacks(
            didChange: { record("changed") },
            savePresentedItemChanges: {
                record("save")
                if behaviour == "fail-save" { throw IPCError(code: .transportFailure, message: "this presenter's save fails") }
                guard let saved else { return }
                // Its own write: not reported to it, and it is not asked to relinquish.
                try FileCoordinator(filePresenter: presenter.value.withLock { $0 }).coordinate(writingItemAt: path, timeout: .seconds(10)) {
                    try $0.replaceContents(with: Array(saved.utf8))
                }
            },
            relinquishToReader: { relinquish("reader") },
            relinquishToWriter: { relinquish("writer") }
        )
        let made = try FilePresenter(presenting: path, callbacks: callbacks)
        presenter.value.withLock { $0 = made }
        return made
    }

    /// `name`, or `directory/name`, in the group: each part a valid endpoint name (so never `..`).
    private func path(_ name: String) throws -> String {
        let parts = name.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard parts.count <= 2 else { throw IPCError(code: .nameOutsideGroup, message: "\(name.debugDescription): at most one subdirectory of the group") }
        var path = group.path
        for part in parts { path += "/" + (try Endpoint(group: group, name: part)).name }
        return path
    }

    private func answer(_ line: String) {
        let bytes = Array((line + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
    }
}

private final class EventLog: Sendable {
    let entries = Mutex<[String]>([])
}

private final class PresenterBox: Sendable {
    let value = Mutex<FilePresenter?>(nil)
}
