import DequeModule
import IPCCore
import Synchronization

/// Runs one connection's ``RequestHandler`` as tasks off the receive path, as an XPC connection
/// runs its handlers on its own queue: a slow or stuck handler holds up its own connection
/// (and, with the serial default, only that connection's later requests), never another one.
///
/// Up to ``ConnectionOptions/maximumConcurrentRequests`` requests are handled at once; one
/// task serves them one after another while more wait. A task that finds nothing waiting is
/// kept, suspended, for the connection's next request, and ends when the connection does: a
/// serial connection makes one task in its life, not one per request (making and freeing a
/// task cost about 4,000 instructions a request, `Scripts/instructions.sh`). Requests beyond
/// the bound wait here, counted against
/// ``ConnectionOptions/messageBufferLimit``: once that much waits, ``accept(_:send:)``
/// says so and the receive path stops reading the connection until a handler takes one
/// (``whenRoom(_:)``), so a peer that sends faster than its handlers answer cannot make the
/// process grow without bound. ``close()`` cancels the running tasks and drops what waits.
final class RequestServer: Sendable {
    /// Sends a reply frame: writes what it can at once, and returns the rest, to be awaited, if
    /// the peer's buffer is full. Not `async` itself: calling an `async` function and returning
    /// from it each cost the task an executor check (about 200 instructions) that the common
    /// case, a reply written whole at once, does without.
    typealias ReplySender = @Sendable (Frame) throws -> (@Sendable () async throws -> Void)?

    private struct State {
        var waiting = Deque<Frame>()
        var waitingBytes = 0
        /// Tasks serving this connection now, by serial (their token: found without hashing).
        var running = TokenTable<Runner>()
        /// Tasks of `running` that wait, suspended, for a request (most recently parked last).
        var parked: [UnsafeContinuation<Frame?, Never>] = []
        var closed = false
        /// Runs once a waiting request is taken (the receive path stopped reading).
        var roomHandler: (@Sendable () -> Void)?
        /// Set at the first request. Holds the connection until ``close()``: the cycle it forms
        /// (connection, core, server, sender) ends there, as every connection's life does.
        var send: Sender?

        var isFull: Bool { waiting.count >= limit.messages || waitingBytes >= limit.bytes }
        let limit: ConnectionOptions.BufferLimit
    }

    /// The reply sender, boxed: a closure returned through `withLock`'s generic result is
    /// wrapped in a thunk, a heap allocation each time; a class reference is returned as is.
    private final class Sender: Sendable {
        let send: ReplySender
        init(_ send: @escaping ReplySender) { self.send = send }
    }

    private let handler: RequestHandler
    private let concurrency: Int
    private let executor: (any TaskExecutor)?
    /// A `Mutex` (a compare-and-swap when free, inlined), not a pthread mutex: about 100
    /// instructions a request less in all (callgrind).
    private let state: Mutex<State>

    /// - Parameter executor: where the tasks run; `nil` for Swift's global executor.
    init(handler: @escaping RequestHandler, concurrency: Int, limit: ConnectionOptions.BufferLimit, executor: (any TaskExecutor)?) {
        precondition(concurrency > 0, "maximumConcurrentRequests must be at least 1")
        self.handler = handler
        self.concurrency = concurrency
        self.executor = executor
        self.state = Mutex(State(limit: limit))
    }

    /// A task serving this connection: being started by ``accept(_:send:)``, or started.
    private enum Runner {
        case starting
        case started(Task<Void, Never>)
    }

    /// What ``accept(_:send:)`` does with a request.
    private enum Admission {
        case closed
        /// It waits; whether the queue is full now.
        case queued(full: Bool)
        /// A task starts for it, with this serial.
        case start(UInt64)
        /// A parked task takes it.
        case resume(UnsafeContinuation<Frame?, Never>)
    }

    /// Takes a request from the receive path: starts a task for it if fewer than the bound run,
    /// else queues it. `send` makes the reply sender (called once per connection). Returns
    /// whether the queue is full now (the caller should stop reading).
    func accept(_ request: Frame, send: () -> ReplySender) -> Bool {
        let admission: Admission = state.withLock { state in
            guard !state.closed else { return .closed }
            if state.send == nil { state.send = Sender(send()) }
            if let parked = state.parked.popLast() { return .resume(parked) }
            guard state.running.count < concurrency else {
                state.waiting.append(request)
                state.waitingBytes += request.payload.count
                return .queued(full: state.isFull)
            }
            return .start(state.running.insert(.starting))
        }
        let serial: UInt64
        switch admission {
        case .closed, .queued(full: false): return false
        case .queued(full: true): return true
        case .resume(let parked):
            parked.resume(returning: request)
            return false
        case .start(let started): serial = started
        }
        // Started with the lock released: the thread that runs it may run at once (on one
        // core, the woken thread preempts this one) and would otherwise find the lock held,
        // and wait, at the cost of two more context switches. Its slot is taken already.
        // The task's closure lives as long as the task, which is as long as the connection: it
        // holds the first request in a box the task empties, not the request itself.
        let first = FirstRequest(request)
        let task = Task(executorPreference: executor) { [self] in await serve(first, serial: serial) }
        let cancel: Bool = state.withLock { state in
            // A task that finished already has given its slot back.
            guard state.running[serial] != nil else { return false }
            state.running[serial] = .started(task)
            return state.closed
        }
        if cancel { task.cancel() }
        return false
    }

    /// Runs `handler` once a waiting request has been taken (at once if the queue has room).
    func whenRoom(_ handler: @escaping @Sendable () -> Void) {
        let now: Bool = state.withLock { state in
            guard state.isFull, !state.closed else { return true }
            state.roomHandler = handler
            return false
        }
        if now { handler() }
    }

    /// The connection ended: cancels the running handlers (their replies are not sent), drops
    /// the waiting requests, and lets go of the reply sender.
    func close() {
        let (running, parked): ([Task<Void, Never>], [UnsafeContinuation<Frame?, Never>]) = state.withLock { state in
            state.closed = true
            state.waiting.removeAll()
            state.waitingBytes = 0
            state.roomHandler = nil
            state.send = nil
            defer { state.parked.removeAll() }
            return (state.running.values.compactMap { if case .started(let task) = $0 { task } else { nil } }, state.parked)
        }
        for task in running { task.cancel() }
        // A parked task ends.
        for task in parked { task.resume(returning: nil) }
    }

    /// The request a task is started for, handed over once: emptied by the task, so that the
    /// task's closure, which lives as long as the task, does not keep the payload.
    private final class FirstRequest: @unchecked Sendable {
        // @unchecked: written before the task starts, taken once by the task.
        private var frame: Frame?
        init(_ frame: Frame) { self.frame = frame }
        func take() -> Frame? {
            defer { frame = nil }
            return frame
        }
    }

    /// One task's life: the request it was made for, then whatever waits; when nothing does,
    /// it parks until ``accept(_:send:)`` hands it the next request, or ``close()`` ends it.
    /// A parked task holds nothing of the requests it answered: each request, its reply and
    /// its sender live in the loop's body only.
    private func serve(_ first: FirstRequest, serial: UInt64) async {
        var next = first.take()
        while next != nil {
            do {
                let request = next!
                next = nil
                // The answer, written here rather than in a function of its own: each `async`
                // call and return costs the task an executor check.
                var reply = Frame(kind: .reply, msgid: request.msgid, correlation: request.correlation)
                do {
                    reply.payload = try await handler(request.msgid, request.payload) ?? []
                } catch {
                    reply.kind = .failure
                    reply.payload = Array(String(describing: error).utf8)
                }
                // Closed: the connection ended, and nobody is there to answer. (Its tasks are
                // cancelled only once it is closed, so this is also the cancellation check.) A
                // reply that cannot be sent is the requester's timeout to report; a torn one
                // has already invalidated the connection.
                if let sender = state.withLock({ $0.closed ? nil : $0.send }), let rest = try? sender.send(reply) {
                    try? await rest()
                }
            }
            next = await withUnsafeContinuation { parking in
                var room: (@Sendable () -> Void)?
                let next: Frame?? = state.withLock { state in
                    guard !state.closed else { return .some(nil) }
                    guard let next = state.waiting.popFirst() else {
                        state.parked.append(parking)
                        return nil
                    }
                    state.waitingBytes -= next.payload.count
                    if !state.isFull {
                        room = state.roomHandler
                        state.roomHandler = nil
                    }
                    return next
                }
                room?()
                if let next { parking.resume(returning: next) }
            }
        }
        // The connection ended (while this task answered or was parked).
        state.withLock { _ = $0.running.remove(serial) }
    }
}
