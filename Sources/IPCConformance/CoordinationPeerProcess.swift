public import Foundation
import IPCCore
import Synchronization

/// A second process that runs file-coordination commands one line at a time (the program of
/// ``FileCoordinationAccess``): it writes, reads, holds locks, presents files and dies while a
/// case or a test watches.
///
/// The contract: the program prints `READY <pid>`, then answers each command line on its
/// standard input with one line, `OK` (a space and a result, for some) or `ERR <why>` (for an
/// ``IPCError``, `<why>` begins with its code, as in `ERR coordinationTimeout: ...`); it exits
/// when its standard input closes. Files are named relative to the group directory. The commands:
///
/// | command | effect |
/// |---|---|
/// | `write <file> <text>` | a coordinated write (10 s timeout) that makes `text` the file's contents |
/// | `write-within <file> <milliseconds> <text>` | the same, with that timeout |
/// | `read <file>` | a coordinated read; answers `OK <contents>` |
/// | `hold-write <file>`, `hold-read <file>` | takes the file for writing or reading and keeps it |
/// | `release` | gives back what `hold-…` took |
/// | `rename <file> <new name>`, `remove <file>` | renames the file within the group, removes its name |
/// | `present <file> <behaviour>` | presents the file, answering coordinators: `answer` (at once), `slow=<ms>` (relinquishes after that long), `hang` (its relinquish never returns), `save=<text>` (when asked to save, writes `text` with a coordinator of its own), `fail-save` (its save fails) |
/// | `events` | `OK` and the events of its presenters so far, in order, separated by spaces: `<file>:save`, `<file>:relinquish-reader`, `<file>:reacquire-reader`, `<file>:relinquish-writer`, `<file>:reacquire-writer`, `<file>:changed` |
/// | `prepare-write <file>,<file>... <count>` | one batch for writing the files, in which it makes `count` coordinated writes to each |
public final class CoordinationPeerProcess: Sendable {
    public let pid: Int32
    private let process: Process
    private let input: FileHandle
    private let answers = Lines()

    /// Starts `executable` with `arguments` and waits for its `READY`.
    /// - Throws: what starting it throws; ``IPCError/Code/transportFailure`` if it says
    ///   something else first; ``IPCError/Code/receiveTimeout`` if it is silent for 30 s.
    public init(executable: URL, arguments: [String]) throws {
        let reading: FileHandle
        (process, input, reading) = try ChildProcess.start(executable, arguments: arguments)
        pid = process.processIdentifier
        Thread.detachNewThread { [answers] in
            var line: [UInt8] = []
            // availableData returns what one read gives (read(upToCount:) would wait for all of it).
            while case let chunk = reading.availableData, !chunk.isEmpty {
                for byte in chunk {
                    guard byte == UInt8(ascii: "\n") else {
                        line.append(byte)
                        continue
                    }
                    answers.append(String(decoding: line, as: UTF8.self))
                    line = []
                }
            }
            answers.close()
        }
        let ready = try answer(seconds: 30)
        guard ready.hasPrefix("READY") else {
            kill()
            throw IPCError(code: .transportFailure, message: "the coordination peer said \(ready.debugDescription) instead of READY")
        }
    }

    /// Sends a command without waiting for its answer.
    public func start(_ command: String) {
        try? input.write(contentsOf: Data((command + "\n").utf8))
    }

    /// Whether an answer is waiting.
    public var hasAnswer: Bool { answers.hasLine }

    /// The next line the peer prints.
    /// - Throws: ``IPCError/Code/receiveTimeout`` if none comes within `seconds` (or the peer ended).
    public func answer(seconds: Double = 30) throws -> String {
        guard let line = answers.next(seconds: seconds) else {
            throw IPCError(code: .receiveTimeout, message: "the coordination peer did not answer within \(seconds) s")
        }
        return line
    }

    /// Runs a command and returns what follows `OK`.
    /// - Throws: ``IPCError/Code/transportFailure`` with the peer's `ERR` line; what ``answer(seconds:)`` throws.
    @discardableResult
    public func run(_ command: String, seconds: Double = 30) throws -> String {
        start(command)
        let line = try answer(seconds: seconds)
        guard line == "OK" || line.hasPrefix("OK ") else {
            throw IPCError(code: .transportFailure, message: "\(command): \(line)")
        }
        return String(line.dropFirst(3))
    }

    /// Kills the peer with SIGKILL and waits until it is gone.
    public func kill() {
        _ = Foundation.kill(pid, SIGKILL)
        process.waitUntilExit()
    }

    /// Closes the peer's input, which ends it, and waits for it to exit.
    public func stop() {
        try? input.close()
        process.waitUntilExit()
    }
}

/// Lines read from the peer, waiting to be taken.
private final class Lines: Sendable {
    private struct State {
        var lines: [String] = []
        var closed = false
    }

    private let state = Mutex(State())
    private let added = DispatchSemaphore(value: 0)

    var hasLine: Bool { state.withLock { !$0.lines.isEmpty } }

    func append(_ line: String) {
        state.withLock { $0.lines.append(line) }
        added.signal()
    }

    /// No more lines will come: a waiting `next` returns `nil` at once.
    func close() {
        state.withLock { $0.closed = true }
        added.signal()
    }

    func next(seconds: Double) -> String? {
        let giveUp = DispatchTime.now() + seconds
        while true {
            let (line, closed): (String?, Bool) = state.withLock { state in
                state.lines.isEmpty ? (nil, state.closed) : (state.lines.removeFirst(), false)
            }
            if let line { return line }
            if closed { return nil }
            guard added.wait(timeout: giveUp) == .success else { return nil }
        }
    }
}
