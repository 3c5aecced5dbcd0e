import DequeModule
import IPCCore
import IPCEngine
import Synchronization

/// Whose turn it is to write to a connection's outbound queue: one message's fragments at a
/// time, so that they stay contiguous. Tasks wait for their turn suspended, in arrival order; a
/// thread of the caller's own (the synchronous send) waits blocked; the event loop's thread
/// never waits: what it sends while the turn is taken, or the queue full, is kept here in
/// order (``deferred``) and sent by a task.
final class SendTurn: Sendable {
    private struct State {
        var closed = false
        var taken = false
        var waitingTasks = Deque<CheckedContinuation<Bool, Never>>()
        /// Messages sent from the loop's thread that are still to go, in order, with the time by
        /// which each must, and their bytes (bounded by ``deferredLimit``).
        var deferred = Deque<(frame: Frame, deadline: UInt64)>()
        var deferredBytes = 0
        /// A task sends ``deferred`` now.
        var draining = false
        /// Ends the wait of the holder of the turn, if it waits for room (``holderWaits(abort:)``).
        var abortHolder: (@Sendable () -> Void)?
        /// What ``close(releasing:)`` left for the holder to run when it gives the turn back.
        var release: (@Sendable () -> Void)?
        /// Threads waiting in ``take(until:)``: only then does giving the turn wake anyone.
        var waitingThreads = 0
    }

    private let state = Mutex(State())
    /// Wakes the threads waiting for a turn; guards nothing else.
    private let threads = ConditionLock()
    /// Bytes the loop's own sends may leave waiting before they fail at once.
    let deferredLimit: Int

    init(deferredLimit: Int) {
        self.deferredLimit = deferredLimit
    }

    /// Takes the turn if it is free and nobody waits (the loop's thread, which never waits).
    func tryTake() -> Bool {
        state.withLock { state in
            guard !state.closed, !state.taken, state.waitingTasks.isEmpty, state.deferred.isEmpty else { return false }
            state.taken = true
            return true
        }
    }

    /// Waits, suspended, for the turn: `false` if the connection closed first.
    func take() async -> Bool {
        await withCheckedContinuation { continuation in
            let now: Bool? = state.withLock { state in
                if state.closed { return false }
                guard state.taken || !state.waitingTasks.isEmpty else {
                    state.taken = true
                    return true
                }
                state.waitingTasks.append(continuation)
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// Waits, blocked, for the turn until `deadline` (``monotonicNanoseconds()``): `false` if
    /// the deadline passed or the connection closed first. Tasks waiting already go first.
    func take(until deadline: UInt64) -> Bool {
        threads.lock()
        defer { threads.unlock() }
        var waiting = false
        defer { if waiting { state.withLock { $0.waitingThreads -= 1 } } }
        while true {
            let outcome: Bool? = state.withLock { state in
                if state.closed { return false }
                guard state.taken || !state.waitingTasks.isEmpty || !state.deferred.isEmpty else {
                    state.taken = true
                    return true
                }
                if !waiting { state.waitingThreads += 1 }
                return nil
            }
            if let outcome { return outcome }
            waiting = true
            guard threads.wait(until: deadline) else { return false }
        }
    }

    /// Wakes the threads waiting for a turn, if any (the usual send has none to wake).
    private func wakeThreads(_ any: Bool) {
        if any { threads.withLock { threads.broadcast() } }
    }

    /// Gives the turn to the next task waiting, or frees it.
    func give() {
        let (next, release, threadsWait): (CheckedContinuation<Bool, Never>?, (@Sendable () -> Void)?, Bool) = state.withLock { state in
            state.abortHolder = nil
            if state.closed {
                state.taken = false
                defer { state.release = nil }
                return (nil, state.release, state.waitingThreads > 0)
            }
            guard let next = state.waitingTasks.popFirst() else {
                state.taken = false
                return (nil, nil, state.waitingThreads > 0)
            }
            return (next, nil, false)
        }
        if let next { return next.resume(returning: true) }
        release?()
        wakeThreads(threadsWait)
    }

    /// The holder of the turn waits for room: `abort` ends that wait if the connection closes.
    /// Returns `false` (and does not keep `abort`) if it has closed already.
    func holderWaits(abort: @escaping @Sendable () -> Void) -> Bool {
        state.withLock { state in
            guard !state.closed else { return false }
            state.abortHolder = abort
            return true
        }
    }

    var isClosed: Bool { state.withLock { $0.closed } }

    /// Keeps a message the loop's thread could not send now, behind any kept before; returns
    /// whether a task must be started to send them (none is sending yet).
    /// - Throws: ``IPCError/Code/sendTimeout`` if ``deferredLimit`` bytes wait already;
    ///   ``IPCError/Code/invalidated`` if the connection closed.
    func keep(_ frame: Frame, deadline: UInt64) throws -> Bool {
        try state.withLock { state in
            if state.closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
            if !state.deferred.isEmpty, state.deferredBytes + frame.payload.count > deferredLimit {
                throw IPCError(code: .sendTimeout, message: "\(deferredLimit) bytes already wait to be sent to a peer that does not read")
            }
            state.deferred.append((frame, deadline))
            state.deferredBytes += frame.payload.count
            defer { state.draining = true }
            return !state.draining
        }
    }

    /// The next kept message, for the task that sends them; `nil` (and that task ends) when
    /// there is none.
    func nextKept() -> (frame: Frame, deadline: UInt64)? {
        let (next, threadsWait): ((frame: Frame, deadline: UInt64)?, Bool) = state.withLock { state in
            guard let next = state.deferred.popFirst() else {
                state.draining = false
                return (nil, state.waitingThreads > 0)
            }
            state.deferredBytes -= next.frame.payload.count
            return (next, false)
        }
        if next == nil { wakeThreads(threadsWait) }
        return next
    }

    /// The connection closed: every waiter is told, kept messages are dropped (a peer that is
    /// gone reads none of them), a holder waiting for room stops waiting, and `release` (which
    /// closes the queue) runs once nobody writes: now, or when the holder gives the turn back.
    func close(releasing release: @escaping @Sendable () -> Void) {
        let (waiting, abort, releaseNow): (Deque<CheckedContinuation<Bool, Never>>, (@Sendable () -> Void)?, Bool) = state.withLock { state in
            state.closed = true
            state.deferred.removeAll()
            state.deferredBytes = 0
            if state.taken { state.release = release }
            defer { state.waitingTasks.removeAll() }
            return (state.waitingTasks, state.abortHolder, !state.taken)
        }
        for task in waiting { task.resume(returning: false) }
        abort?()
        if releaseNow { release() }
        threads.withLock { threads.broadcast() }
    }
}
