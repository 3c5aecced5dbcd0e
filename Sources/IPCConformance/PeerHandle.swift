import Foundation
import IPCCore
import Synchronization

/// A peer process started by a case: records when it was killed, and is stopped (or, if it
/// will not stop, killed) when the case ends.
final class PeerHandle: Sendable {
    let process: any ConformancePeerProcess
    private let state = Mutex<(announcement: ConformancePeer.Announcement?, killedAt: ContinuousClock.Instant?)>((nil, nil))

    init(_ process: any ConformancePeerProcess) {
        self.process = process
    }

    var pid: Int32 { process.pid }
    var grandchildPID: Int32? { state.withLock { $0.announcement?.grandchildPID } }
    var killedAt: ContinuousClock.Instant? { state.withLock { $0.killedAt } }

    /// Waits, on a thread of its own, for the peer's announcement.
    /// - Throws: what the launcher's ``ConformancePeerProcess/waitUntilReady(timeout:)`` throws.
    func waitUntilReady(timeout: Duration = .seconds(20)) async throws {
        let announcement = try await runBlocking { [process] in try process.waitUntilReady(timeout: timeout) }
        state.withLock { $0.announcement = announcement }
    }

    /// SIGKILLs the peer and returns the moment just before, from which a case measures.
    @discardableResult
    func kill() -> ContinuousClock.Instant {
        let now = ContinuousClock.now
        state.withLock { $0.killedAt = now }
        process.kill()
        return now
    }

    /// Stops the peer, killing it if it has not exited 5 s after being asked to. A suspended
    /// peer is resumed first.
    func shutDown() async {
        process.resume()
        let stopped = Mutex(false)
        Thread.detachNewThread { [process] in
            process.stop()
            stopped.withLock { $0 = true }
        }
        if await poll(within: .seconds(5), { stopped.withLock { $0 } }) { return }
        process.kill()
        _ = await poll(within: .seconds(5)) { stopped.withLock { $0 } }
    }
}
