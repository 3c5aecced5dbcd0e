import DequeModule
import Glibc
import IPCCore

/// The messages a connection has received and its application has not yet taken, behind
/// ``MessageConnection/messages``: bounded, so that a peer that sends faster than the
/// application reads cannot make the process grow without limit.
///
/// When the buffer holds ``ConnectionOptions/messageBufferLimit`` (messages or payload bytes),
/// the receive thread waits until the application takes one: it stops reading, the kernel's
/// buffer fills, and the peer's sends wait and then time out (`sendTimeout`). Nothing is
/// dropped. A requester reading its own reply never waits here (see ``push(_:waitForRoom:)``).
/// One consumer, as for any `AsyncStream`; cancelling it ends its iteration.
final class MessageBuffer: @unchecked Sendable {
    private struct State {
        var queue = Deque<ReceivedMessage>()
        var bytes = 0
        var finished = false
        var consumer: UnsafeContinuation<ReceivedMessage?, Never>?
    }

    private let limit: ConnectionOptions.BufferLimit
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let room: UnsafeMutablePointer<pthread_cond_t>
    /// Guarded by `mutex`.
    private var state = State()

    init(limit: ConnectionOptions.BufferLimit) {
        self.limit = limit
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        room = .allocate(capacity: 1)
        pthread_cond_init(room, nil)
    }

    deinit {
        pthread_cond_destroy(room)
        pthread_mutex_destroy(mutex)
        room.deallocate()
        mutex.deallocate()
    }

    /// Messages waiting for the consumer.
    var count: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return state.queue.count
    }

    private var isFull: Bool { state.queue.count >= limit.messages || state.bytes >= limit.bytes }

    /// Adds a message, or hands it straight to a consumer that is waiting. With `waitForRoom`,
    /// first waits while the buffer is full (the receive thread's backpressure); without, the
    /// message is added anyway and the caller should stop reading (see the return value).
    /// Returns whether the buffer is full now. After ``finish()`` the message is dropped, as
    /// the connection is over.
    @discardableResult
    func push(_ message: ReceivedMessage, waitForRoom: Bool) -> Bool {
        pthread_mutex_lock(mutex)
        while waitForRoom, isFull, !state.finished, state.consumer == nil {
            pthread_cond_wait(room, mutex)
        }
        // A consumer waits only when nothing is buffered: handing it this message keeps the order.
        // (Checked after waiting: the consumer may have emptied the buffer and begun to wait.)
        if let consumer = state.consumer {
            state.consumer = nil
            pthread_mutex_unlock(mutex)
            consumer.resume(returning: message)
            return false
        }
        if !state.finished {
            state.queue.append(message)
            state.bytes += message.payload.count
        }
        let full = isFull
        pthread_mutex_unlock(mutex)
        return full
    }

    /// No more messages: the consumer gets what is buffered, then the end; a producer waiting
    /// for room stops waiting.
    func finish() {
        pthread_mutex_lock(mutex)
        state.finished = true
        let consumer = state.queue.isEmpty ? state.consumer : nil
        if consumer != nil { state.consumer = nil }
        pthread_cond_broadcast(room)
        pthread_mutex_unlock(mutex)
        consumer?.resume(returning: nil)
    }

    /// The next message, waiting for one; `nil` at the end or when the consuming task is cancelled.
    func next() async -> ReceivedMessage? {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<ReceivedMessage?, Never>) in
                pthread_mutex_lock(mutex)
                if let message = state.queue.popFirst() {
                    state.bytes -= message.payload.count
                    pthread_cond_signal(room)
                    pthread_mutex_unlock(mutex)
                    continuation.resume(returning: message)
                } else if state.finished || Task.isCancelled {
                    pthread_mutex_unlock(mutex)
                    continuation.resume(returning: nil)
                } else {
                    state.consumer = continuation
                    pthread_mutex_unlock(mutex)
                }
            }
        } onCancel: {
            pthread_mutex_lock(mutex)
            let consumer = state.consumer
            state.consumer = nil
            pthread_mutex_unlock(mutex)
            consumer?.resume(returning: nil)
        }
    }
}
