import Dispatch
import Glibc
import IPCCore
import IPCEngine
import IPCSystem

/// Waits for the posts of every ``NotifyRegistration`` of the process: one thread per 127
/// registrations, each asleep in one `futex_waitv` on all of their counters and on a word of
/// its own that says "the set changed". A post wakes it; it hands each registration whose
/// counter moved one call of its handler, on Dispatch's global queue, and waits again. A
/// registration whose call is running is left out of the wait until the call ends (posts
/// meanwhile coalesce into the next call), as is a suspended one.
///
/// Where the kernel has no `futex_waitv` (before Linux 5.16), the threads look at their counters
/// every millisecond instead.
final class NotifyWatcher: @unchecked Sendable {
    // @unchecked: `groups` and every observation's mutable state are guarded by `lock`.
    static let shared = NotifyWatcher()

    /// Guards the groups, their observations and each observation's state; signalled when a
    /// handler call ends.
    let lock = ConditionLock()
    private var groups: [Group] = []

    /// Counters one thread waits for: the kernel's maximum less its own word.
    private static let perThread = FutexCounter.maximumWaitedAtOnce - 1

    /// One thread and the registrations it waits for.
    fileprivate final class Group: @unchecked Sendable {
        // @unchecked: `observations` is guarded by the watcher's lock; `changed` is a futex word.
        var observations: [NotifyObservation] = []
        /// Posted when the set of observations, or what one waits for, changes.
        let changed: FutexCounter
        private let word: UnsafeMutableRawPointer

        init() throws {
            word = .allocate(byteCount: 4, alignment: 4)
            word.storeBytes(of: 0, as: UInt32.self)
            changed = FutexCounter(address: word.assumingMemoryBound(to: UInt32.self))
        }
    }

    /// Starts calling `observation`'s handler after posts of its counter.
    /// - Throws: ``IPCError/Code/transportFailure`` if no thread could be started for it.
    func add(_ observation: NotifyObservation) throws {
        let (group, start): (Group, Bool) = try lock.withLock {
            if let group = groups.first(where: { $0.observations.count < Self.perThread }) {
                group.observations.append(observation)
                observation.group = group
                return (group, false)
            }
            let group = try Group()
            group.observations.append(observation)
            observation.group = group
            groups.append(group)
            return (group, true)
        }
        if start {
            do {
                try PosixThread.detach(name: "ipc-notify-obs") { [self] in watch(group) }
            } catch {
                lock.withLock {
                    groups.removeAll { $0 === group }
                    observation.group = nil
                }
                throw error
            }
        } else {
            group.changed.post()
        }
    }

    /// Stops calls to `observation`'s handler: once this returns, none is running (unless this
    /// is called from inside it) and none starts.
    func remove(_ observation: NotifyObservation) {
        let group: Group? = lock.withLock {
            observation.cancelled = true
            // Wait out a call running on another thread; from inside the handler, just return.
            while let thread = observation.runningOn, pthread_equal(thread, pthread_self()) == 0 {
                lock.wait()
            }
            guard let group = observation.group else { return nil }
            group.observations.removeAll { $0 === observation }
            observation.group = nil
            return group
        }
        group?.changed.post()
    }

    /// Suspends or resumes calls to `observation`'s handler. A resume gives one call if the name
    /// was posted meanwhile.
    func setSuspended(_ observation: NotifyObservation, _ suspended: Bool) {
        let group: Group? = lock.withLock {
            observation.suspended = suspended
            return observation.group
        }
        group?.changed.post()
    }

    /// How often a thread looks whether the files its registrations' counters are in are still
    /// the ones their paths name (``relocateMoved(_:)``).
    static let fileCheckPeriod: Duration = .seconds(1)

    /// The thread of one group: waits, then hands out calls, for the life of the process.
    private func watch(_ group: Group) {
        var waitedFor: [NotifyObservation] = []
        var counters: [FutexCounter] = []
        var seen: [UInt32] = []
        var nextFileCheck = ContinuousClock.now + Self.fileCheckPeriod
        while true {
            // What to wait for; the observations are held for the wait, and so the mappings
            // their counters are in.
            lock.withLock {
                waitedFor = group.observations.filter(\.isWaiting)
                counters = [group.changed] + waitedFor.map(\.counter)
                seen = [group.changed.value] + waitedFor.map(\.seen)
            }
            if FutexCounter.wait(counters, whileEqualTo: seen, timeout: Self.fileCheckPeriod) == .unavailable {
                _ = group.changed.wait(whileEqualTo: seen[0], timeout: .milliseconds(1))
            }
            if ContinuousClock.now >= nextFileCheck {
                relocateMoved(group)
                nextFileCheck = ContinuousClock.now + Self.fileCheckPeriod
            }
            let due: [(NotifyObservation, UInt32)] = lock.withLock {
                waitedFor.compactMap { observation in
                    guard observation.isWaiting else { return nil }
                    let now = observation.counter.value
                    guard now != observation.seen else { return nil }
                    observation.calling = true
                    defer { observation.seen = now }
                    return (observation, observation.seen)
                }
            }
            for (observation, before) in due {
                DispatchQueue.global().async { [self] in call(observation, postsAfter: before, group) }
            }
            waitedFor = []
        }
    }

    /// Moves the observations whose counter is no longer their name's (the table's file was
    /// removed or replaced by another process, or its slot lost when the table was cut or
    /// overwritten and the names claimed again) to their names' counters in the file the path
    /// names now (a process that posts opens that one), and gives each one call: posts made there
    /// before the move are not known. An `lstat` and a read of the slot per observation. A move
    /// that fails (the new table full, its lock kept by another process) ends the pass: the rest
    /// wait for the next, a period later, rather than each waiting out the lock's timeout.
    private func relocateMoved(_ group: Group) {
        let observations = lock.withLock { group.observations.filter { !$0.cancelled } }
        for observation in observations {
            let current = lock.withLock { observation.counter }
            let moved: FutexCounter
            do {
                guard let counter = try observation.relocate(current) else { continue }
                moved = counter
            } catch {
                return
            }
            lock.withLock {
                observation.counter = moved
                // Not the count it has: the next look hands it a call (or its resume does).
                observation.seen = moved.value &+ 1
            }
        }
    }

    /// One call of `observation`'s handler, unless it was cancelled or suspended meanwhile (a
    /// suspended one keeps the posts for its resume: `before` is what it had seen).
    private func call(_ observation: NotifyObservation, postsAfter before: UInt32, _ group: Group) {
        let run: Bool = lock.withLock {
            if observation.cancelled || observation.suspended {
                if observation.suspended { observation.seen = before }
                observation.calling = false
                return false
            }
            observation.runningOn = pthread_self()
            return true
        }
        if run {
            observation.handler()
            lock.withLock {
                observation.runningOn = nil
                observation.calling = false
                lock.broadcast()
            }
        }
        // Waited for again, with any posts made during the call.
        group.changed.post()
    }
}

/// One registration's state, kept by ``NotifyWatcher``. Mutable fields are guarded by the
/// watcher's lock.
final class NotifyObservation: @unchecked Sendable {
    // @unchecked: see above.
    /// Its name's counter, in the table's file as it was mapped; replaced (``relocate``) when
    /// another process removed that file or put another in its place, or its slot no longer
    /// holds the name.
    var counter: FutexCounter
    let handler: @Sendable () -> Void
    /// The name's counter in the table the path names now, if `counter` is no longer it.
    let relocate: @Sendable (FutexCounter) throws -> FutexCounter?
    /// The count last handed to a call (or seen at registration).
    var seen: UInt32
    var cancelled = false
    var suspended = false
    /// A call is queued or running.
    var calling = false
    var runningOn: pthread_t?
    fileprivate var group: NotifyWatcher.Group?

    init(counter: FutexCounter, handler: @escaping @Sendable () -> Void, relocate: @escaping @Sendable (FutexCounter) throws -> FutexCounter?) {
        self.counter = counter
        self.handler = handler
        self.relocate = relocate
        seen = counter.value
    }

    /// Whether its thread waits for its counter now.
    var isWaiting: Bool { !cancelled && !suspended && !calling }
}
