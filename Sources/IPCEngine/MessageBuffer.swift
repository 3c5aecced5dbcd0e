import DequeModule
import IPCCore

/// The messages a connection has received and its application has not yet taken, behind
/// ``MessageConnection/messages``: bounded, so that a peer that sends faster than the
/// application reads cannot make the process grow without limit.
///
/// When the buffer holds ``ConnectionOptions/messageBufferLimit`` (messages or payload bytes),
/// the receive path stops reading until the application takes one: the kernel's buffer fills,
/// and the peer's sends wait and then time out (`sendTimeout`). Nothing is dropped. The event
/// loop stops watching the connection and asks to be told when there is room
/// (``whenRoom(_:)``); a reader that serves several connections ends this one instead.
/// One consumer, as for any `AsyncStream`; cancelling it ends its iteration.
final class MessageBuffer: Sendable {
    private struct State {
        var queue = Deque<ReceivedMessage>()
        var bytes = 0
        var finished = false
        var consumer: UnsafeContinuation<ReceivedMessage?, Never>?
        /// Runs once the buffer has room again.
        var roomHandler: (@Sendable () -> Void)?
    }

    private let limit: ConnectionOptions.BufferLimit
    private let lock = ConditionLock()
    /// Guarded by `lock` (so without dynamic exclusivity checks).
    @exclusivity(unchecked) private nonisolated(unsafe) var state = State()

    init(limit: ConnectionOptions.BufferLimit) {
        self.limit = limit
    }

    /// Messages waiting for the consumer.
    var count: Int { lock.withLock { state.queue.count } }

    private var isFull: Bool { state.queue.count >= limit.messages || state.bytes >= limit.bytes }

    /// Adds a message (even to a full buffer: the caller then stops reading, see the return
    /// value), or hands it straight to a consumer that is waiting. Returns whether the buffer
    /// is full now. After ``finish()`` the message is dropped, as the connection is over.
    @discardableResult
    func push(_ message: ReceivedMessage) -> Bool {
        lock.lock()
        // A consumer waits only when nothing is buffered: handing it this message keeps the order.
        if let consumer = state.consumer {
            state.consumer = nil
            lock.unlock()
            consumer.resume(returning: message)
            return false
        }
        if !state.finished {
            state.queue.append(message)
            state.bytes += message.payload.count
        }
        let full = isFull
        lock.unlock()
        return full
    }

    /// Runs `handler` once the buffer has room (at once, on the calling thread, if it has room
    /// now or is finished). For a receive path that cannot wait: it stops reading and resumes here.
    func whenRoom(_ handler: @escaping @Sendable () -> Void) {
        let now: Bool = lock.withLock {
            guard isFull, !state.finished else { return true }
            state.roomHandler = handler
            return false
        }
        if now { handler() }
    }

    /// No more messages: the consumer gets what is buffered, then the end.
    func finish() {
        lock.lock()
        state.finished = true
        state.roomHandler = nil
        let consumer = state.queue.isEmpty ? state.consumer : nil
        if consumer != nil { state.consumer = nil }
        lock.unlock()
        consumer?.resume(returning: nil)
    }

    /// The next message, waiting for one; `nil` at the end or when the consuming task is cancelled.
    func next() async -> ReceivedMessage? {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<ReceivedMessage?, Never>) in
                lock.lock()
                if let message = state.queue.popFirst() {
                    state.bytes -= message.payload.count
                    var room: (@Sendable () -> Void)?
                    if !isFull {
                        room = state.roomHandler
                        state.roomHandler = nil
                    }
                    lock.unlock()
                    room?()
                    continuation.resume(returning: message)
                } else if state.finished || Task.isCancelled {
                    lock.unlock()
                    continuation.resume(returning: nil)
                } else {
                    state.consumer = continuation
                    lock.unlock()
                }
            }
        } onCancel: {
            let consumer: UnsafeContinuation<ReceivedMessage?, Never>? = lock.withLock {
                defer { state.consumer = nil }
                return state.consumer
            }
            consumer?.resume(returning: nil)
        }
    }
}
