import Foundation
import Synchronization

/// Waits until `condition` holds, checking every 2 ms; returns whether it held within `limit`.
func poll(within limit: Duration, _ condition: @Sendable () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + limit
    while !condition() {
        guard ContinuousClock.now < deadline else { return false }
        try? await Task.sleep(for: .milliseconds(2))
    }
    return true
}

/// The result of `task` if it finishes within `limit`; `nil` if it is still running (it is
/// left running: the case's tear-down releases what it waits on).
func result<T: Sendable>(of task: Task<T, any Error>, within limit: Duration) async -> Result<T, any Error>? {
    let outcome = Mutex<Result<T, any Error>?>(nil)
    Task {
        let result = await task.result
        outcome.withLock { $0 = result }
    }
    _ = await poll(within: limit) { outcome.withLock { $0 != nil } }
    return outcome.withLock { $0 }
}
