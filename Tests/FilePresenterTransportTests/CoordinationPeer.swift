import Foundation
import IPCConformance
import IPCBenchKit
import IPCCore
import Synchronization

/// A second process that runs file coordination commands (`ipcbench peer --role coordinator`),
/// one line at a time: it holds locks, writes and dies while the test watches.
final class CoordinationPeer: Sendable {
    let pid: Int32
    private let process: Process
    private let input: FileHandle
    private let answers = Lines()

    init(group: GroupDirectory) throws {
        let process = Process()
        process.executableURL = try PeerProcess.executableURL()
        process.arguments = [
            "peer", "--transport", "file-presenter", "--role", "coordinator",
            "--group", group.path, "--endpoint", "coordinator",
        ]
        let (input, output) = try ChildProcess.run(process, input: true, output: true)
        self.process = process
        self.input = input!
        pid = process.processIdentifier
        let reading = output!
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
        }
        let ready = try answer(seconds: 20)
        guard ready.hasPrefix("READY") else {
            throw IPCError(code: .transportFailure, message: "coordination peer said \(ready.debugDescription)")
        }
    }

    /// Sends a command without waiting for its answer.
    func start(_ command: String) {
        input.write(Data((command + "\n").utf8))
    }

    /// Whether an answer is waiting.
    var hasAnswer: Bool { answers.hasLine }

    /// The next line the peer prints.
    func answer(seconds: Double = 30) throws -> String {
        guard let line = answers.next(seconds: seconds) else {
            throw IPCError(code: .receiveTimeout, message: "the coordination peer did not answer within \(seconds) s")
        }
        return line
    }

    /// Runs a command and returns what follows `OK`.
    /// - Throws: ``IPCError/Code/transportFailure`` with the peer's `ERR` line.
    @discardableResult
    func run(_ command: String) throws -> String {
        start(command)
        let line = try answer()
        guard line.hasPrefix("OK") else {
            throw IPCError(code: .transportFailure, message: "\(command): \(line)")
        }
        return String(line.dropFirst(3))
    }

    /// Kills the peer with SIGKILL and waits until it is gone.
    func kill() {
        _ = Foundation.kill(pid, SIGKILL)
        process.waitUntilExit()
    }

    /// Closes the peer's input, which ends it, and waits for it to exit.
    func stop() {
        try? input.close()
        process.waitUntilExit()
    }
}

/// Lines read from the peer, waiting to be taken.
private final class Lines: Sendable {
    private let lines = Mutex<[String]>([])
    private let added = DispatchSemaphore(value: 0)

    var hasLine: Bool { lines.withLock { !$0.isEmpty } }

    func append(_ line: String) {
        lines.withLock { $0.append(line) }
        added.signal()
    }

    func next(seconds: Double) -> String? {
        guard added.wait(timeout: .now() + seconds) == .success else { return nil }
        return lines.withLock { $0.removeFirst() }
    }
}

/// Counts `didChange` calls and lets a test wait for them.
final class ChangeCounter: Sendable {
    private let state = Mutex(0)
    private let signal = DispatchSemaphore(value: 0)

    var count: Int { state.withLock { $0 } }

    func record() {
        state.withLock { $0 += 1 }
        signal.signal()
    }

    /// Waits (blocking a thread, not the test's task pool) until at least `target` calls happened.
    func wait(for target: Int, seconds: Double = 10) async -> Bool {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [self] in
                let giveUp = DispatchTime.now() + seconds
                while count < target {
                    if signal.wait(timeout: giveUp) == .timedOut {
                        continuation.resume(returning: count >= target)
                        return
                    }
                }
                continuation.resume(returning: true)
            }
        }
    }
}
