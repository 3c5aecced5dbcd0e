import Foundation
import IPCConformance
import IPCBenchKit
import IPCCore
import IPCFileCoordination
import Synchronization

/// A second process that runs file coordination commands (`ipcbench peer --role coordinator`),
/// one line at a time: it holds locks, writes, presents and dies while the test watches.
typealias CoordinationPeer = CoordinationPeerProcess

extension CoordinationPeerProcess {
    // From a test's task, the blocking calls run on a thread of their own (`runBlocking`): a
    // test that waited for its peer on one of the cooperative pool's two threads held up every
    // other test of the process, and in the full target a listener's request waited 0.3-1 s.
    @discardableResult
    func run(_ command: String, seconds: Double = 30) async throws -> String {
        try await runBlocking { try self.run(command, seconds: seconds) }
    }

    func answer(seconds: Double = 30) async throws -> String {
        try await runBlocking { try self.answer(seconds: seconds) }
    }

    convenience init(group: GroupDirectory) throws {
        try self.init(
            executable: try PeerProcess.executableURL(),
            arguments: ["peer", "--transport", "file-presenter", "--role", "coordinator", "--group", group.path, "--endpoint", "coordinator"]
        )
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
