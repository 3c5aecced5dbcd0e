import IPCPosix
import Synchronization

/// Who reads a connection's incoming messages: the connection's own receive thread, or a
/// requester waiting for its reply, on the requester's thread.
///
/// A reply that the receive thread reads must be handed to the waiting task, which costs a
/// wake-up and, when the processes share a core, one more context switch per round trip than a
/// plain blocking client pays. A requester that reads its own reply saves both. So when requests
/// follow one another, the receive thread hands reading over and parks:
///
/// 1. A request that finds the receive thread reading goes the usual way (its reply is handed
///    over) and asks the thread to step aside; after dispatching what it read, the thread parks.
/// 2. While the thread is parked, one requester at a time reads directly until its reply is in,
///    dispatching everything else it reads in arrival order, exactly as the thread would.
///    Other requesters meanwhile wait the usual way.
/// 3. The thread takes reading back when a parking period passes with no direct read, when a
///    requester leaves with other requests still waiting or hits anything but its reply (end of
///    stream, an error), or when the connection is invalidated. The period starts at
///    ``firstParkPeriodNanoseconds`` and doubles, up to ``longestParkPeriodNanoseconds``, while
///    direct reads go on: the parked thread's own wake-ups then disturb fewer round trips.
///
/// So a connection that is busy making requests reads messages only while a request is in
/// flight; a one-way message that arrives between requests waits for the next request or the
/// end of the parking period, at most ``longestParkPeriodNanoseconds`` (the end of the stream
/// too, for a transport that learns of its peer's death only by reading). Reading is never done by two threads
/// at once, and the lock orders every hand-over, so the reading state (a reassembler, say) moves
/// between threads safely.
package final class ReceiveOwnership: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`.
    private struct State {
        /// The receive thread has handed reading over.
        var parked = false
        /// A requester is reading (only while `parked`).
        var requesterReading = false
        /// Another request was turned away while a requester was reading: it waits for its reply
        /// the usual way, so the reader must hand back when it stops.
        var turnedAwayWhileReading = false
        /// Direct reads begun since the parked thread last looked.
        var directReadsSinceCheck = 0
        /// The connection is ending: no more direct reads.
        var stopped = false
    }

    /// How long the parked thread first waits before it checks for direct reads.
    package static let firstParkPeriodNanoseconds: Int64 = 1_000_000
    /// The longest it waits between checks.
    package static let longestParkPeriodNanoseconds: Int64 = 16_000_000

    /// A request found the thread reading and asked it to step aside. Written under `mutex`;
    /// the receive thread reads it first without the lock, as it does between every two reads.
    private let handOverRequested = Atomic<Bool>(false)
    private let lock = ConditionLock()
    /// Guarded by `lock`.
    private var state = State()

    package init() {}

    private func locked<T>(_ body: (inout State) -> T) -> T {
        lock.withLock { body(&state) }
    }

    // MARK: Requester side

    /// Whether the caller may read now. If it may, it must call ``endDirectRead(handBack:)``
    /// when it stops. If not, the request waits the usual way, and the receive thread is asked
    /// to step aside for the next one.
    package func beginDirectRead() -> Bool {
        locked { state in
            if state.parked, !state.requesterReading, !state.stopped {
                state.requesterReading = true
                state.directReadsSinceCheck += 1
                return true
            }
            if !state.parked { handOverRequested.store(true, ordering: .relaxed) }
            if state.requesterReading { state.turnedAwayWhileReading = true }
            return false
        }
    }

    /// Ends a direct read. Reading goes back to the receive thread at once if `handBack` is set
    /// (other requests are waiting for replies, or the read met the end of the stream or an
    /// error that the thread must act on) or a request was turned away meanwhile.
    package func endDirectRead(handBack: Bool) {
        locked { state in
            state.requesterReading = false
            // Decided under the lock, so a request turned away a moment ago is never stranded.
            if handBack || state.stopped || state.turnedAwayWhileReading {
                state.turnedAwayWhileReading = false
                state.parked = false
                lock.signal()
            }
        }
    }

    // MARK: Receive-thread side

    /// Called by the receive thread between reads: parks if a request asked it to and
    /// `awaitingReplies` is false, and returns once the thread owns reading again.
    ///
    /// `awaitingReplies` says whether a request is still waiting for its reply the usual way
    /// (one that was turned away a moment ago, say): parking then would leave its reply unread
    /// until the period ends. It is asked under this object's lock, so a request that begins a
    /// direct read afterwards finds the thread parked.
    package func parkIfRequested(unless awaitingReplies: () -> Bool) {
        guard handOverRequested.load(ordering: .relaxed) else { return }
        lock.lock()
        defer { lock.unlock() }
        guard handOverRequested.load(ordering: .relaxed), !state.stopped, !awaitingReplies() else { return }
        handOverRequested.store(false, ordering: .relaxed)
        state.parked = true
        state.directReadsSinceCheck = 0
        var period = Self.firstParkPeriodNanoseconds
        while state.parked {
            lock.wait(until: monotonicNanoseconds() &+ UInt64(period))
            guard state.parked else { break }
            // Take reading back if nobody read directly for a period, or the connection is ending,
            // but never from under a requester that is reading.
            if !state.requesterReading, state.stopped || state.directReadsSinceCheck == 0 {
                state.parked = false
            }
            state.directReadsSinceCheck = 0
            period = min(period * 2, Self.longestParkPeriodNanoseconds)
        }
    }

    /// The connection is ending: refuse direct reads from now on, and wake a parked thread (it
    /// takes reading back once no requester reads).
    package func stop() {
        locked { state in
            state.stopped = true
            if !state.requesterReading { state.parked = false }
            lock.signal()
        }
    }
}
