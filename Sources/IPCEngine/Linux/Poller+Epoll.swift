#if canImport(Glibc)
import CIPCShims
import Glibc
import IPCCore
import IPCSystem
import SystemPackage

/// The event loop's seam to the kernel's readiness API: epoll on Linux (kqueue would sit beside
/// it on Darwin, with the same four operations). Level-triggered: a descriptor that still has
/// something to read is reported again on the next wait.
package final class Poller: Sendable {
    /// What a registration waits for.
    package struct Interest: OptionSet, Sendable {
        package let rawValue: UInt8
        package init(rawValue: UInt8) { self.rawValue = rawValue }
        package static let readable = Interest(rawValue: 1)

        /// Neither readable nor writable: such a registration is kept out of the kernel's set.
        package var watchesNothing: Bool { !contains(.readable) && !contains(.writable) }
        package static let writable = Interest(rawValue: 2)
        /// Report each change once (epoll's `EPOLLET`), for a doorbell channel
        /// (``ChannelReadiness/doorbell``); without it, a registration is level-triggered.
        package static let edgeTriggered = Interest(rawValue: 4)
    }

    /// One readiness report: the token given at registration and what happened.
    struct Event {
        var token: UInt64
        var readable: Bool
        var writable: Bool
        /// Hang-up or error: reading tells which, and the handler should read.
        var hangUp: Bool
    }

    /// The readiness reports of one loop round, in storage of its own that every round reuses:
    /// an array's append and emptying cost a uniqueness check and a generic call each, about
    /// 100 instructions a round on each side of a round trip (callgrind). Loop thread only.
    struct EventBuffer: ~Copyable {
        private var storage: UnsafeMutablePointer<Event>
        private var capacity: Int
        /// The reports held, at `0..<count`.
        private(set) var count = 0

        init(capacity: Int) {
            precondition(capacity > 0)
            storage = .allocate(capacity: capacity)
            self.capacity = capacity
        }

        deinit {
            storage.deallocate()
        }

        var isEmpty: Bool { count == 0 }

        subscript(index: Int) -> Event {
            precondition(index >= 0 && index < count, "event index out of range")
            return storage[index]
        }

        mutating func append(_ event: Event) {
            if count == capacity {
                // More reports than ever before in one round (polled registrations and the
                // kernel's): twice the room, kept from then on.
                let grown = UnsafeMutablePointer<Event>.allocate(capacity: 2 * capacity)
                grown.moveInitialize(from: storage, count: count)
                storage.deallocate()
                storage = grown
                capacity *= 2
            }
            (storage + count).initialize(to: event)
            count += 1
        }

        /// Forgets every report (an `Event` is plain data: nothing to deinitialize).
        mutating func removeAll() {
            count = 0
        }
    }

    /// The token that ``wake()`` reports; registrations never use it.
    static let wakeToken: UInt64 = 0
    /// The token of the timer (``armTimer(at:)``); registrations never use it.
    static let timerToken: UInt64 = UInt64.max

    /// The epoll instance (the transfer ring watches it while the loop waits there).
    let epollFD: CInt
    private let wakeFD: CInt
    /// A timerfd on `CLOCK_MONOTONIC`: the loop's next deadline, armed only when it changes, so
    /// that waiting costs no timer set-up per call (epoll_wait's own timeout would).
    private let timerFD: CInt
    /// What `epoll_wait` fills, made once: a temporary allocation of its size on every wait
    /// cost more than the rest of a wait's own work (callgrind). Used by the loop's thread only,
    /// in ``wait(into:timeoutMilliseconds:)``.
    private nonisolated(unsafe) let kernelEvents: UnsafeMutablePointer<epoll_event>
    /// How many reports one wait takes at most.
    static let kernelEventCapacity = 64

    init() throws {
        let epollFD = epoll_create1(CInt(EPOLL_CLOEXEC))
        guard epollFD >= 0 else { throw IPCError.syscall("epoll_create1", Errno(rawValue: errno)) }
        let wakeFD = eventfd(0, CInt(EFD_CLOEXEC) | CInt(EFD_NONBLOCK))
        guard wakeFD >= 0 else {
            let error = Errno(rawValue: errno)
            try? FileDescriptor(rawValue: epollFD).close()
            throw IPCError.syscall("eventfd", error)
        }
        let timerFD = timerfd_create(CLOCK_MONOTONIC, CInt(TFD_CLOEXEC) | CInt(TFD_NONBLOCK))
        guard timerFD >= 0 else {
            let error = Errno(rawValue: errno)
            try? FileDescriptor(rawValue: wakeFD).close()
            try? FileDescriptor(rawValue: epollFD).close()
            throw IPCError.syscall("timerfd_create", error)
        }
        self.epollFD = epollFD
        self.wakeFD = wakeFD
        self.timerFD = timerFD
        kernelEvents = .allocate(capacity: Self.kernelEventCapacity)
        try add(wakeFD, token: Self.wakeToken, interest: .readable)
        try add(timerFD, token: Self.timerToken, interest: .readable)
    }

    deinit {
        kernelEvents.deallocate()
        try? FileDescriptor(rawValue: timerFD).close()
        try? FileDescriptor(rawValue: wakeFD).close()
        try? FileDescriptor(rawValue: epollFD).close()
    }

    /// Makes a wait return once `deadline` (``monotonicNanoseconds()``) has passed; `nil`
    /// disarms. Replaces the previous deadline.
    func armTimer(at deadline: UInt64?) {
        var value = itimerspec()
        if let deadline {
            // Zero would disarm: a deadline already passed fires at the next nanosecond.
            let at = max(deadline, 1)
            value.it_value = timespec(tv_sec: Int(at / 1_000_000_000), tv_nsec: Int(at % 1_000_000_000))
        }
        _ = timerfd_settime(timerFD, CInt(TFD_TIMER_ABSTIME), &value, nil)
    }

    private static func mask(_ interest: Interest) -> UInt32 {
        var mask: UInt32 = 0
        if interest.contains(.readable) { mask |= EPOLLIN.rawValue | EPOLLRDHUP.rawValue }
        if interest.contains(.writable) { mask |= EPOLLOUT.rawValue }
        if interest.contains(.edgeTriggered), mask != 0 { mask |= EPOLLET.rawValue }
        return mask
    }

    private func control(_ operation: CInt, _ fd: CInt, token: UInt64, interest: Interest) throws {
        var event = epoll_event()
        event.events = Self.mask(interest)
        event.data.u64 = token
        do { _ = try syscallRetryingInterrupts { epoll_ctl(epollFD, operation, fd, &event) } } catch {
            throw IPCError.syscall("epoll_ctl", error, context: "descriptor \(fd)")
        }
    }

    func add(_ fd: CInt, token: UInt64, interest: Interest) throws {
        try control(EPOLL_CTL_ADD, fd, token: token, interest: interest)
    }

    func modify(_ fd: CInt, token: UInt64, interest: Interest) throws {
        try control(EPOLL_CTL_MOD, fd, token: token, interest: interest)
    }

    /// Stops watching `fd` (before it is closed: a closed descriptor leaves epoll on its own only
    /// once no duplicate of it is open).
    func remove(_ fd: CInt) {
        _ = epoll_ctl(epollFD, EPOLL_CTL_DEL, fd, nil)
    }

    /// Waits at most `timeoutMilliseconds` (-1: no limit, 0: only looks) and appends what is
    /// ready to `events`, at most ``kernelEventCapacity`` reports. A wake-up (``wake()``) or the
    /// timer is consumed here and not reported as an event; returns whether the timer fired.
    /// Called by the loop's thread only.
    @discardableResult
    func wait(into events: inout EventBuffer, timeoutMilliseconds: CInt) -> Bool {
        let buffer = kernelEvents
        let count = ipc_sys_epoll_wait(epollFD, buffer, CInt(Self.kernelEventCapacity), timeoutMilliseconds)
        guard count > 0 else { return false }
        var timerFired = false
        for index in 0..<Int(count) {
            let raw = buffer[index]
            if raw.data.u64 == Self.wakeToken || raw.data.u64 == Self.timerToken {
                var value: UInt64 = 0
                _ = ipc_sys_read(raw.data.u64 == Self.wakeToken ? wakeFD : timerFD, &value, 8)
                timerFired = timerFired || raw.data.u64 == Self.timerToken
                continue
            }
            let hangUp = raw.events & (EPOLLHUP.rawValue | EPOLLERR.rawValue | EPOLLRDHUP.rawValue) != 0
            events.append(Event(
                token: raw.data.u64,
                readable: raw.events & EPOLLIN.rawValue != 0 || hangUp,
                writable: raw.events & EPOLLOUT.rawValue != 0,
                hangUp: hangUp
            ))
        }
        return timerFired
    }

    /// Makes a ``wait(into:timeoutMilliseconds:)`` in progress, or the next one, return.
    func wake() {
        var one: UInt64 = 1
        _ = ipc_sys_write(wakeFD, &one, 8)
    }
}

/// Identifies the calling kernel thread cheaply (no system call).
enum ThreadIdentity {
    static var current: UInt { UInt(bitPattern: Int(bitPattern: UInt(pthread_self()))) }
}

/// A mutex with a condition variable, heap-allocated (a pthread mutex must not move): for the
/// few places where a thread of the caller's own must sleep until another thread says so — a
/// synchronous send waiting for its turn, a dedicated receive thread waiting for room. Nothing
/// `async` waits on it.
package final class ConditionLock: @unchecked Sendable {
    // @unchecked: the pthread objects are used only through their own locking calls.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let condition: UnsafeMutablePointer<pthread_cond_t>

    package init() {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        condition = .allocate(capacity: 1)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    package func lock() { pthread_mutex_lock(mutex) }
    package func unlock() { pthread_mutex_unlock(mutex) }

    package func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    /// Waits (the lock held) until signalled or, with a deadline (``monotonicNanoseconds()``),
    /// until it passes. Returns `false` once the deadline has passed.
    @discardableResult
    package func wait(until deadline: UInt64? = nil) -> Bool {
        guard let deadline else {
            pthread_cond_wait(condition, mutex)
            return true
        }
        if monotonicNanoseconds() >= deadline { return false }
        var time = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
        pthread_cond_timedwait(condition, mutex, &time)
        return monotonicNanoseconds() < deadline
    }

    package func signal() { pthread_cond_signal(condition) }
    package func broadcast() { pthread_cond_broadcast(condition) }
}

/// Waits on the calling thread until `fd` can take more bytes, at most until `deadline`.
/// Returns `false` if the deadline passed first. For synchronous senders on their own threads.
func waitUntilWritable(_ fd: CInt, deadline: UInt64) -> Bool {
    while true {
        let now = monotonicNanoseconds()
        guard now < deadline else { return false }
        let milliseconds = CInt(clamping: (deadline - now + 999_999) / 1_000_000)
        var descriptor = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        let result = poll(&descriptor, 1, milliseconds)
        if result > 0 { return true }
        if result < 0, errno != EINTR { return true }
    }
}
#endif
