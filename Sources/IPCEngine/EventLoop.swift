#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import DequeModule
import HeapModule
package import IPCCore
import Synchronization
public import SystemPackage

/// What runs on the event loop when a registered descriptor is ready.
package protocol EventHandler: AnyObject, Sendable {
    /// Called on the loop's thread. `hangUp` means the peer hung up or the descriptor has an
    /// error pending: reading tells which.
    func handleEvent(readable: Bool, writable: Bool, hangUp: Bool)

    /// Whether the loop looks for something to read itself while it spins
    /// (``pollWhileSpinning()``, ``armBeforeSleep()``; see ``EngineChannel``'s requirements of
    /// the same names). Asked once, at registration. Default: no.
    var pollsWhileSpinning: Bool { get }

    /// Something to read, found without waiting (loop thread, while it spins).
    func pollWhileSpinning() -> Bool

    /// The loop is about to sleep: ask the peer to wake it (ring the doorbell) from now on.
    /// Returns whether something came meanwhile, so that the loop handles it instead of sleeping.
    func armBeforeSleep() -> Bool

    /// What a stall report names when ``handleEvent(readable:writable:hangUp:)`` blocked the
    /// loop (see ``EventLoop/stalls``). Asked only then. Default: the handler's type name.
    var stallLabel: String { get }
}

extension EventHandler {
    package var stallLabel: String { String(describing: type(of: self)) }
    package var pollsWhileSpinning: Bool { false }
    package func pollWhileSpinning() -> Bool { false }
    package func armBeforeSleep() -> Bool { false }
}

/// One thread per process that waits for every registered descriptor at once (epoll, through
/// ``Poller``), runs timers, and runs jobs — including Swift tasks: it is a `TaskExecutor`
/// (SE-0417).
///
/// Connections of every engine-based transport register here, so a process with a thousand
/// connections still runs one loop thread. A task that prefers this executor
/// (`withTaskExecutorPreference(EventLoop.shared)`, or ``MessageConnection``'s preferred executor
/// in the harness) sends a request, suspends, and is resumed *on this thread* right after the
/// loop reads its reply: no thread hand-over on the reply path beyond the kernel's own wake-up.
/// A task that does not prefer it is resumed on Swift's global executor, one hand-over more.
///
/// Work on this thread must not block: handlers, accept filters and message handlers that run
/// here delay every connection of the process. The loop times each callback it runs, and one
/// that runs longer than its stall threshold is counted in ``stalls`` and reported on standard
/// error, once per culprit.
public final class EventLoop: TaskExecutor, @unchecked Sendable {
    // @unchecked: every mutable field is behind `state` (a Mutex) or an Atomic, except
    // `draining`, `localJobs`, `localDraining`, `ownJobShared`, `beforeWaitingWork`,
    // `beforeWaitingRunning` and `reportedStalls`, which only the loop's thread touches; the
    // event buffer is a local of it.

    private enum Job {
        case closure(@Sendable () -> Void)
        case task(UnownedJob)

        var stallLabel: String {
            switch self {
            case .closure: "a closure queued on the event loop"
            case .task: "a task on the event loop's executor"
            }
        }
    }

    private struct Timer: Comparable {
        var deadline: UInt64
        var sequence: UInt64
        var action: @Sendable () -> Void

        static func < (lhs: Timer, rhs: Timer) -> Bool { (lhs.deadline, lhs.sequence) < (rhs.deadline, rhs.sequence) }
        static func == (lhs: Timer, rhs: Timer) -> Bool { lhs.deadline == rhs.deadline && lhs.sequence == rhs.sequence }
    }

    private struct Registration {
        var fd: CInt
        var handler: any EventHandler
        var interest: Poller.Interest
        var spinNanoseconds: Int64
    }

    private struct State {
        var jobs = Deque<Job>()
        var timers = Heap<Timer>()
        var timerSequence: UInt64 = 0
        var registrations = TokenTable<Registration>()
        /// The registrations the spinning loop polls itself, while they wait for something
        /// readable.
        var polled: [PolledRegistration] = []
        var stalls = LoopStalls()
    }

    private final class PolledRegistration: @unchecked Sendable {
        // @unchecked: `lastFound` is read and written on the loop's thread only.
        let token: UInt64
        let handler: any EventHandler
        /// The loop round in which the spinning poll last found something here, or first saw
        /// the registration (0 until then: rounds count from 1).
        var lastFound: UInt64 = 0

        init(token: UInt64, handler: any EventHandler) {
            self.token = token
            self.handler = handler
        }

        /// Found something in this loop round or the two before: a conversation is going on.
        func isActive(inRound round: UInt64) -> Bool {
            if lastFound == 0 { lastFound = round }
            return round &- lastFound <= 2
        }
    }

    private let poller: Poller
    private let state = Mutex(State())
    /// The jobs being run, taken from `state` in one swap; touched on the loop's thread only
    /// (so without dynamic exclusivity checks).
    @exclusivity(unchecked) private var draining = Deque<Job>()
    /// Jobs the loop's own thread queued while nothing waited in `state`'s queue (a task it
    /// resumed, a closure it queued): they take no lock and no atomic read-modify-write, about
    /// 150 instructions a job less (callgrind; one a round trip for a request from a task on
    /// the loop's executor). They run before the jobs in `state`'s queue, which were all queued
    /// after them or by a thread still queueing (and so not ordered with them): the jobs run in
    /// the order they were queued. Loop thread only.
    @exclusivity(unchecked) private var localJobs = Deque<Job>()
    /// A job the loop queued on `state`'s queue (something else waited there) has not been
    /// taken yet: the loop's later jobs go behind it. Needed besides `pendingJobs`, which a
    /// thread that has appended its job but not yet counted it leaves at 0 or below. Loop
    /// thread only.
    @exclusivity(unchecked) private var ownJobShared = false
    /// The jobs of `localJobs` being run, swapped out as `draining` is.
    @exclusivity(unchecked) private var localDraining = Deque<Job>()
    /// Work to run on the loop's thread once the jobs and timers of this round are done and
    /// before the loop asks the kernel for events (``beforeWaiting(_:)``); loop thread only.
    @exclusivity(unchecked) private var beforeWaitingWork: [() -> Void] = []
    /// The work of ``beforeWaitingWork`` being run, swapped out so that neither array's
    /// storage is copied or given up.
    @exclusivity(unchecked) private var beforeWaitingRunning: [() -> Void] = []
    /// The loop is about to block, or blocks, in the poller: a job from another thread must wake it.
    private let sleeping = Atomic<Bool>(false)
    /// The loop thread's identity, once it runs.
    private let loopThread = Atomic<UInt>(0)
    /// How long the loop polls before it blocks: the longest spin of any registration that asked.
    private let spinNanoseconds = Atomic<Int64>(0)
    /// Jobs queued and not yet taken: read without the lock between rounds.
    private let pendingJobs = Atomic<Int>(0)
    /// A timer became the earliest since the loop last looked: it must re-arm.
    private let timersChanged = Atomic<Bool>(true)
    /// A callback that runs longer than this is a stall.
    private let stallNanoseconds: UInt64
    /// Receives a stall's report, one line without its newline.
    private let report: @Sendable (String) -> Void
    /// The labels already reported; touched on the loop's thread only.
    @exclusivity(unchecked) private var reportedStalls = Set<String>()

    private static let sharedLoop = Mutex<EventLoop?>(nil)

    /// The process's event loop, made on first use. Its stall threshold is
    /// `IPCBENCH_LOOP_STALL_MS` (whole milliseconds, read when the loop is made), else 100 ms.
    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses an epoll instance or
    ///   an eventfd (descriptor table full); the next call tries again.
    public static func shared() throws -> EventLoop {
        try sharedLoop.withLock { loop in
            if let loop { return loop }
            let threshold = stallThreshold(environment: getenv("IPCBENCH_LOOP_STALL_MS").map { String(cString: $0) })
            let made = try EventLoop(name: "ipc-loop", stallThreshold: threshold, largeTransfers: LargeTransfers.requested)
            loop = made
            return made
        }
    }

    /// The stall threshold `IPCBENCH_LOOP_STALL_MS` asks for: a positive whole number of
    /// milliseconds; anything else (unset, not a number, zero) gives the default, 100 ms.
    package static func stallThreshold(environment value: String?) -> Duration {
        guard let value, let milliseconds = Int(value), milliseconds > 0 else { return .milliseconds(100) }
        return .milliseconds(milliseconds)
    }

    /// A loop of its own, with its thread started (tests; a process normally uses ``shared()``).
    /// The thread runs for the rest of the process. A callback that runs longer than
    /// `stallThreshold` is a stall; `report` receives each culprit's first report (a line
    /// without its newline; default: standard error).
    package init(
        name: String,
        stallThreshold: Duration = .milliseconds(100),
        largeTransfers: LargeTransfers = .requested,
        report: @escaping @Sendable (String) -> Void = EventLoop.writeToStandardError
    ) throws {
        self.largeTransfers = largeTransfers
        poller = try Poller()
        stallNanoseconds = stallThreshold.wholeNanoseconds
        self.report = report
        try PosixThread.detach(name: name) { [self] in run() }
    }

    /// Whether the caller runs on this loop's thread.
    public var inEventLoop: Bool { loopThread.load(ordering: .relaxed) == ThreadIdentity.current }

    /// The number of descriptors registered.
    package var registrationCount: Int { state.withLock { $0.registrations.count } }

    // MARK: Jobs

    public func enqueue(_ job: consuming ExecutorJob) {
        push(.task(UnownedJob(job)))
    }

    /// Runs `work` on the loop's thread, after what is already queued. It must not block.
    public func execute(_ work: @escaping @Sendable () -> Void) {
        push(.closure(work))
    }

    /// Runs `work` on the loop's thread after the jobs and timers of the loop's current round,
    /// before it next asks the kernel for events (and so before it sleeps): for work that
    /// gathers what this round's jobs did, as a connection writes the frames its sends held
    /// back in one call. Call it on the loop's thread only; `work` must not block.
    package func beforeWaiting(_ work: @escaping () -> Void) {
        assert(inEventLoop, "beforeWaiting is for the loop's thread")
        beforeWaitingWork.append(work)
    }

    private func push(_ job: Job) {
        // On the loop's thread, with nothing waiting in the shared queue: behind what the loop
        // queued itself (see `localJobs`). A job another thread is queueing meanwhile is not
        // ordered with this one, so either order is right.
        let onLoop = inEventLoop
        if onLoop {
            if !ownJobShared, pendingJobs.load(ordering: .sequentiallyConsistent) == 0 {
                localJobs.append(job)
                return
            }
            ownJobShared = true
        }
        state.withLock { $0.jobs.append(job) }
        pendingJobs.add(1, ordering: .sequentiallyConsistent)
        if !onLoop, sleeping.exchange(false, ordering: .sequentiallyConsistent) { poller.wake() }
    }

    // MARK: Large transfers

    /// How a loop moves the rest of a large frame that a socket had no room for, or that has
    /// not all arrived (docs/ENGINE.md, "Large frames in the kernel's hands").
    public enum LargeTransfers: String, Sendable, CaseIterable {
        /// Handed to the kernel whole, through the loop's io_uring ring (``TransferRing``), the
        /// loop waiting in the ring while any is in flight; the default. Where the kernel
        /// refuses io_uring (`kernel.io_uring_disabled`, a seccomp filter, an old kernel), the
        /// loop moves them as with ``epoll`` instead.
        case ioUring = "io_uring"
        /// Written and read in pieces, each when the poller (epoll) reports room or bytes.
        case epoll

        /// What `IPCBENCH_LARGE_TRANSFERS` asks for: `epoll`, else ``ioUring`` (unset,
        /// `io_uring`, or anything else).
        public static var requested: LargeTransfers {
            choice(environment: getenv("IPCBENCH_LARGE_TRANSFERS").map { String(cString: $0) })
        }

        package static func choice(environment value: String?) -> LargeTransfers {
            value == LargeTransfers.epoll.rawValue ? .epoll : .ioUring
        }

        /// What a loop made now with ``requested`` would use: `io_uring`, or `epoll` with why
        /// (asked for, or the kernel's refusal). Sets up a ring and closes it to find out.
        public static func inUse() -> String {
            guard requested == .ioUring else { return "epoll (IPCBENCH_LARGE_TRANSFERS=epoll)" }
            #if os(Linux)
            switch TransferRing.make() {
            case .success(let ring):
                ring.close()
                return "io_uring"
            case .failure(let error):
                return "epoll (io_uring refused: \(error))"
            }
            #else
            return "epoll (no io_uring on this system)"
            #endif
        }
    }

    /// How this loop moves the rest of large frames.
    package let largeTransfers: LargeTransfers
    /// The loop has no transfer ring and will make none, so it moves large frames the epoll way:
    /// it was asked to (``LargeTransfers/epoll``), or the kernel refused a ring. Set at the
    /// first request for the ring; read by any thread, where a stale `false` costs one flush
    /// that finds no ring.
    package var noTransferRing: Bool {
        get { noTransferRingFlag.load(ordering: .relaxed) }
        set { noTransferRingFlag.store(newValue, ordering: .relaxed) }
    }
    private let noTransferRingFlag = Atomic<Bool>(false)

    #if os(Linux)
    private enum TransferRingState {
        case notMade
        case made(TransferRing)
        case refused
    }

    /// Loop thread only.
    @exclusivity(unchecked) private var transferRingState = TransferRingState.notMade

    /// The loop's transfer ring, made at first use (loop thread only), or `nil` if the loop moves
    /// large frames the epoll way: asked to (``LargeTransfers/epoll``), or the kernel refused.
    package func transferRing() -> TransferRing? {
        assert(inEventLoop, "the transfer ring is the loop thread's")
        switch transferRingState {
        case .made(let ring): return ring
        case .refused: return nil
        case .notMade:
            guard largeTransfers == .ioUring, case .success(let ring) = TransferRing.make() else {
                transferRingState = .refused
                noTransferRing = true
                return nil
            }
            transferRingState = .made(ring)
            return ring
        }
    }

    /// The ring, if it has transfers in flight (loop thread).
    private var ringInFlight: TransferRing? {
        guard case .made(let ring) = transferRingState, ring.hasTransfersInFlight else { return nil }
        return ring
    }
    #endif

    /// Makes the loop's transfer ring now, where the loop will use one, instead of at the first
    /// frame whose rest it hands to the kernel (which depends on how fast the peer reads): for
    /// a count of the process's descriptors that must find the ring there before, not as a new
    /// descriptor after (the soak's census). Any thread; returns once the loop has done it,
    /// with whether the loop has a ring (`false`: it moves large frames the epoll way).
    @discardableResult
    package func makeTransferRingNow() async -> Bool {
        await withCheckedContinuation { (done: CheckedContinuation<Bool, Never>) in
            execute {
                #if os(Linux)
                done.resume(returning: self.transferRing() != nil)
                #else
                done.resume(returning: false)
                #endif
            }
        }
    }

    // MARK: Timers

    /// Runs `action` on the loop's thread once `deadline` (``monotonicNanoseconds()``) has
    /// passed. Timers are not cancelled: an action checks whether it still has something to do.
    package func schedule(at deadline: UInt64, _ action: @escaping @Sendable () -> Void) {
        let earliest = state.withLock { state in
            state.timerSequence &+= 1
            let earliest = state.timers.min.map { deadline < $0.deadline } ?? true
            state.timers.insert(Timer(deadline: deadline, sequence: state.timerSequence, action: action))
            return earliest
        }
        if earliest { timersChanged.store(true, ordering: .sequentiallyConsistent) }
        if earliest, !inEventLoop, sleeping.exchange(false, ordering: .sequentiallyConsistent) { poller.wake() }
    }

    // MARK: Watching a descriptor (for transport authors)

    /// A descriptor being watched with ``watchReadable(_:label:_:)``.
    public struct ReadinessWatch: Sendable, Hashable {
        fileprivate let token: UInt64
    }

    /// Calls `handler` on the loop's thread whenever `descriptor` is readable (level-triggered:
    /// again and again while it stays readable), until ``cancel(_:)``. For what is not a
    /// connection, such as a listening socket: accept what is waiting in the handler, without
    /// blocking. Cancel before closing the descriptor. `label` names the watch in a stall
    /// report (``stalls``).
    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses.
    public func watchReadable(
        _ descriptor: FileDescriptor,
        label: String = "a readiness watch",
        _ handler: @escaping @Sendable () -> Void
    ) throws -> ReadinessWatch {
        ReadinessWatch(token: try register(descriptor.rawValue, interest: .readable, handler: ClosureHandler(label: label, handler)))
    }

    /// Stops a watch; its handler does not run afterwards, unless it is running now (on the loop).
    public func cancel(_ watch: ReadinessWatch) {
        deregister(watch.token)
    }

    /// Stops calling a watch's handler for `duration`, then resumes it, unless it was
    /// cancelled meanwhile: for a handler that met a shortage it cannot resolve at once (the
    /// descriptor table full), so that a level-triggered descriptor does not spin the loop.
    public func pause(_ watch: ReadinessWatch, for duration: Duration) {
        setInterest(watch.token, [])
        schedule(at: monotonicNanoseconds() &+ max(duration, .zero).wholeNanoseconds) { [self] in setInterest(watch.token, .readable) }
    }

    private final class ClosureHandler: EventHandler {
        let stallLabel: String
        let handler: @Sendable () -> Void

        init(label: String, _ handler: @escaping @Sendable () -> Void) {
            stallLabel = label
            self.handler = handler
        }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            handler()
        }
    }

    // MARK: Registrations

    /// Starts watching `fd` for `interest`; `handler` runs on the loop's thread. With a spinning
    /// `waitStrategy` the loop polls for that long before it blocks while this registration lasts.
    ///
    /// A registration with no interest (here or after ``setInterest(_:_:)``) is kept out of the
    /// kernel's set, not left in it disabled: a disabled epoll item is still woken by files that
    /// wake every poller on each change (a message queue does, on every receive), which costs the
    /// loop a wake-up for nothing.
    /// - Throws: ``IPCError/Code/transportFailure`` if the kernel refuses.
    package func register(_ fd: CInt, interest: Poller.Interest, waitStrategy: WaitStrategy = .blocking, handler: any EventHandler) throws -> UInt64 {
        let token = state.withLock { state in
            let token = state.registrations.insert(Registration(fd: fd, handler: handler, interest: interest, spinNanoseconds: waitStrategy.spinNanoseconds))
            if waitStrategy.spins, handler.pollsWhileSpinning, interest.contains(.readable) {
                state.polled.append(PolledRegistration(token: token, handler: handler))
            }
            // Before the descriptor can report anything: a loop that sees this registration's
            // first event already spins, and so polls it and arms it before sleeping.
            if waitStrategy.spins { updateSpin(state) }
            return token
        }
        do {
            if !interest.watchesNothing { try poller.add(fd, token: token, interest: interest) }
        } catch {
            // Nothing may poll a channel its owner is about to close.
            state.withLock { state in
                state.registrations.remove(token)
                state.polled.removeAll { $0.token == token }
                if waitStrategy.spins { updateSpin(state) }
            }
            throw error
        }
        return token
    }

    /// Starts watching registration `token`, made with no interest, for `interest`: for an owner
    /// whose handler must be ready before the first event reaches it (an edge-triggered
    /// descriptor reports its first edge once; a handler that cannot act on it yet loses it).
    /// - Throws: the kernel's refusal; the registration then still watches nothing.
    package func watch(_ token: UInt64, _ interest: Poller.Interest) throws {
        guard !interest.watchesNothing else { return }
        let fd: CInt? = state.withLock { state in
            guard var registration = state.registrations[token] else { return nil }
            precondition(registration.interest.watchesNothing, "watch(_:_:) is for a registration that watches nothing yet")
            registration.interest = interest
            state.registrations[token] = registration
            if registration.spinNanoseconds > 0, registration.handler.pollsWhileSpinning, interest.contains(.readable) {
                state.polled.append(PolledRegistration(token: token, handler: registration.handler))
            }
            return registration.fd
        }
        guard let fd else { return }
        do {
            try poller.add(fd, token: token, interest: interest)
        } catch {
            state.withLock { state in
                _ = state.registrations.update(token) { $0.interest = [] }
                state.polled.removeAll { $0.token == token }
            }
            throw error
        }
    }

    /// Changes what registration `token` waits for. Calls for one registration must not race
    /// (its owner makes them in order, as under a lock of its own): the kernel is told after the
    /// loop's table is updated.
    package func setInterest(_ token: UInt64, _ interest: Poller.Interest) {
        let change: (fd: CInt, was: Poller.Interest)? = state.withLock { state in
            guard var registration = state.registrations[token], registration.interest != interest else { return nil }
            let was = registration.interest
            registration.interest = interest
            state.registrations[token] = registration
            if registration.spinNanoseconds > 0, registration.handler.pollsWhileSpinning {
                state.polled.removeAll { $0.token == token }
                if interest.contains(.readable) {
                    state.polled.append(PolledRegistration(token: token, handler: registration.handler))
                }
            }
            return (registration.fd, was)
        }
        guard let (fd, was) = change else { return }
        // No interest: out of the kernel's set (see ``register(_:interest:waitStrategy:handler:)``).
        if interest.watchesNothing {
            if !was.watchesNothing { poller.remove(fd) }
        } else if was.watchesNothing {
            try? poller.add(fd, token: token, interest: interest)
        } else {
            try? poller.modify(fd, token: token, interest: interest)
        }
    }

    /// Stops watching registration `token`; its handler is not called afterwards (from an event
    /// already read in this round, neither: events are looked up by token). Call before closing
    /// the descriptor.
    package func deregister(_ token: UInt64) {
        guard let registration = state.withLock({ state -> Registration? in
            let registration = state.registrations.remove(token)
            if registration?.handler.pollsWhileSpinning == true { state.polled.removeAll { $0.token == token } }
            return registration
        }) else { return }
        if !registration.interest.watchesNothing { poller.remove(registration.fd) }
        if registration.spinNanoseconds > 0 { state.withLock { updateSpin($0) } }
    }

    /// Sets the spin to the longest any registration asked for; called with the lock held, so
    /// that updates apply in order.
    private func updateSpin(_ state: State) {
        spinNanoseconds.store(state.registrations.values.map(\.spinNanoseconds).max() ?? 0, ordering: .relaxed)
    }

    // MARK: The loop

    private func run() {
        loopThread.store(ThreadIdentity.current, ordering: .relaxed)
        var events = Poller.EventBuffer(capacity: Poller.kernelEventCapacity)
        var armedDeadline: UInt64?
        var timerFired = false
        // Counts spin rounds across the loop's rounds, so that the kernel is asked every 16th
        // round even while a polled registration always has something (a flood).
        var spinRound = 0
        // Paces those asks of the kernel by what each costs (KernelAskPacing).
        var kernelAsks = KernelAskPacing()
        // Counts the loop's rounds, for telling the polled registrations that are talking now
        // from the idle ones.
        var round: UInt64 = 0
        // The clock's reading after the last event handler of the round before, when there
        // was one: the start of the first job's timing, which follows at once.
        var handlersEnded: UInt64?
        while true {
            round &+= 1
            runJobs(since: handlersEnded)
            // Timers are looked at only when the timer fired or a new earliest one came: no clock
            // read and no lock on the rounds between.
            if timerFired || timersChanged.exchange(false, ordering: .sequentiallyConsistent) {
                let nextDeadline = runTimers()
                if nextDeadline != armedDeadline {
                    poller.armTimer(at: nextDeadline)
                    armedDeadline = nextDeadline
                }
            }
            timerFired = false
            // What this round's jobs held back for the end of the round (the frames a
            // connection's sends kept for one write); it may queue jobs, which the next round runs
            // (the poll below does not sleep then).
            while !beforeWaitingWork.isEmpty {
                swap(&beforeWaitingWork, &beforeWaitingRunning)
                for work in beforeWaitingRunning { work() }
                beforeWaitingRunning.removeAll(keepingCapacity: true)
            }
            events.removeAll()
            let spin = spinNanoseconds.load(ordering: .relaxed)
            // Registrations that poll themselves are asked directly while the loop spins (in
            // shared memory, or with a read that keeps what it found), and a doorbell channel
            // is armed only before the loop sleeps: a writer to a spinning notify reader makes
            // no system call, and a spinning socket reader one read per message.
            let watches = spin > 0 ? state.withLock { $0.polled } : []
            if spin > 0 {
                var now = monotonicNanoseconds()
                let end = now &+ UInt64(spin)
                // Registrations that found something in the last few rounds are polled on every
                // spin round, the idle ones on every 16th (a poll of a socket or queue is a
                // system call: a loop with one conversation and three idle connections would
                // otherwise make four per round, and notice the reply later). With none
                // active, all are polled on every round.
                let anyActive = watches.contains { $0.isActive(inRound: round) }
                repeat {
                    let next = spinRound &+ 1
                    let everyone = !anyActive || next & 15 == 0
                    for watch in watches where (everyone || watch.isActive(inRound: round)) && watch.handler.pollWhileSpinning() {
                        watch.lastFound = round
                        events.append(Poller.Event(token: watch.token, readable: true, writable: false, hangUp: false))
                    }
                    // The kernel's readiness list is asked on every round when no registration
                    // polls itself, else on every 16th at most, whatever the polls found (other
                    // descriptors, room to write, rings for room, timers), and no sooner after
                    // the last ask than its cost allows (KernelAskPacing).
                    spinRound = next
                    if watches.isEmpty {
                        timerFired = poller.wait(into: &events, timeoutMilliseconds: 0)
                    } else if kernelAsks.shouldAsk(round: spinRound, now: now) {
                        let asking = monotonicNanoseconds()
                        timerFired = poller.wait(into: &events, timeoutMilliseconds: 0)
                        now = monotonicNanoseconds()
                        kernelAsks.asked(from: asking, to: now)
                    }
                    if !events.isEmpty || timerFired || hasJobs() { break }
                    cpuRelax()
                    now = monotonicNanoseconds()
                } while now < end
            }
            if events.isEmpty, !timerFired {
                for watch in watches where watch.handler.armBeforeSleep() {
                    events.append(Poller.Event(token: watch.token, readable: true, writable: false, hangUp: false))
                }
            }
            if events.isEmpty, !timerFired {
                sleeping.store(true, ordering: .sequentiallyConsistent)
                // Looked at after `sleeping` is set: a job queued, or an earliest timer
                // scheduled, by a thread that saw the loop awake (and so did not wake it) since
                // the top of this round is seen here, and the loop goes round instead of
                // sleeping past it. (A timer scheduled from another thread while the loop was
                // about to sleep once waited for an unrelated event: a sender's retry stalled.)
                let somethingCame = hasJobs() || timersChanged.load(ordering: .sequentiallyConsistent)
                #if os(Linux)
                if !somethingCame, let ring = ringInFlight {
                    // A large frame's rest is in the kernel's hands: wait in the ring, where the
                    // kernel's retries of it run without waking this thread, until it completes
                    // or anything else happens (the epoll descriptor, watched from the ring).
                    // epoll is asked only if its descriptor was readable.
                    if ring.wait(watching: poller.epollFD) {
                        timerFired = poller.wait(into: &events, timeoutMilliseconds: 0)
                    }
                } else {
                    timerFired = poller.wait(into: &events, timeoutMilliseconds: somethingCame ? 0 : -1)
                }
                #else
                timerFired = poller.wait(into: &events, timeoutMilliseconds: somethingCame ? 0 : -1)
                #endif
                sleeping.store(false, ordering: .relaxed)
            }
            // Each callback is timed with one clock read: the reading after it is the start of
            // the next one's timing (the ring's completions' end, the first handler's start).
            var reapEnded: UInt64?
            #if os(Linux)
            // Transfers the kernel finished (their connections go on with their queues and frames,
            // the frames read behind a received one included): timed as one callback.
            if let ring = ringInFlight {
                let started = monotonicNanoseconds()
                ring.reap()
                let ended = monotonicNanoseconds()
                if ended &- started > stallNanoseconds { stalled(for: ended &- started, by: Self.transferCompletionsLabel) }
                reapEnded = ended
            }
            #endif
            handlersEnded = reapEnded
            guard !events.isEmpty else { continue }
            var started = reapEnded ?? monotonicNanoseconds()
            for index in 0..<events.count {
                let event = events[index]
                guard let handler = state.withLock({ $0.registrations[event.token]?.handler }) else { continue }
                handler.handleEvent(readable: event.readable, writable: event.writable, hangUp: event.hangUp)
                let ended = monotonicNanoseconds()
                if ended &- started > stallNanoseconds { stalled(for: ended &- started, by: handler.stallLabel) }
                started = ended
            }
            handlersEnded = started
        }
    }

    /// The stall culprit for the transfer ring's completions (``TransferRing/reap()``).
    static let transferCompletionsLabel = "the completions of large frames' transfers (the transfer ring)"

    private func hasJobs() -> Bool {
        !localJobs.isEmpty || ownJobShared || pendingJobs.load(ordering: .sequentiallyConsistent) > 0
    }

    /// Runs the jobs queued (the loop's own first, see `localJobs`; those queued while they
    /// run wait for the next round); `handlersEnded` is a clock reading taken just before, if
    /// any.
    private func runJobs(since handlersEnded: UInt64?) {
        let shared = ownJobShared || pendingJobs.load(ordering: .sequentiallyConsistent) > 0
        guard shared || !localJobs.isEmpty else { return }
        // Each queue is swapped with its drained one, which keeps its storage: no allocation
        // per round for the job that resumes a request.
        swap(&localJobs, &localDraining)
        let localCount = localDraining.count
        var count = 0
        if shared {
            state.withLock { swap(&$0.jobs, &draining) }
            ownJobShared = false
            count = draining.count
            pendingJobs.subtract(count, ordering: .sequentiallyConsistent)
        }
        var started = handlersEnded ?? monotonicNanoseconds()
        while let job = localDraining.popFirst() ?? draining.popFirst() {
            switch job {
            case .closure(let work): work()
            case .task(let task): task.runSynchronously(on: asUnownedTaskExecutor())
            }
            let ended = monotonicNanoseconds()
            if ended &- started > stallNanoseconds { stalled(for: ended &- started, by: job.stallLabel) }
            started = ended
        }
        // Storage grown by a burst is not kept for good.
        if localCount > 1024 { localDraining = Deque() }
        if count > 1024 { draining = Deque() }
    }

    /// Runs the timers that are due; returns the next deadline.
    private func runTimers() -> UInt64? {
        // The reading that decides which timer is due is also the end of the last action's
        // timing: no clock read more.
        var actionStarted: UInt64?
        while true {
            let now = monotonicNanoseconds()
            if let actionStarted, now &- actionStarted > stallNanoseconds {
                stalled(for: now &- actionStarted, by: "a timer on the event loop")
            }
            let due: Timer? = state.withLock { state in
                guard let first = state.timers.min, first.deadline <= now else { return nil }
                return state.timers.removeMin()
            }
            guard let due else { return state.withLock { $0.timers.min?.deadline } }
            actionStarted = now
            due.action()
        }
    }

    // MARK: Stalls

    /// The stalls seen so far: callbacks that held the loop's thread longer than its threshold.
    public var stalls: LoopStalls { state.withLock { $0.stalls } }

    /// Counts a stall, and reports it if `label` has not been reported before (loop thread).
    @inline(never)
    private func stalled(for nanoseconds: UInt64, by label: String) {
        let milliseconds = Double(nanoseconds) / 1e6
        let first = reportedStalls.insert(label).inserted
        state.withLock { state in
            state.stalls.count += 1
            state.stalls.longestMilliseconds = max(state.stalls.longestMilliseconds, milliseconds)
            if first { state.stalls.culprits.append(label) }
        }
        guard first else { return }
        report("ipcbench: the event loop was blocked for \(nanoseconds / 1_000_000) ms by \(label); every connection of this process waited. Keep work on the loop short: serve with the async request handler, or move the work to a task.")
    }

    /// Writes `line` and a newline to standard error: a stall's default report.
    package static func writeToStandardError(_ line: String) {
        _ = try? FileDescriptor.standardError.writeAll((line + "\n").utf8)
    }
}

/// The callbacks that blocked an event loop: each ran longer than the loop's stall threshold
/// (100 ms unless `IPCBENCH_LOOP_STALL_MS` says otherwise), and every connection of the process
/// waited meanwhile.
public struct LoopStalls: Sendable, Codable, Equatable {
    /// How many callbacks ran too long.
    public var count: Int = 0
    /// The longest of them, in milliseconds.
    public var longestMilliseconds: Double = 0
    /// What ran too long, each named once, in the order first seen: a connection's handler, a
    /// readiness watch's label, or the kind of job or timer.
    public var culprits: [String] = []
}
