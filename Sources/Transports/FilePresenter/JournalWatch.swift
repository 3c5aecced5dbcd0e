import Glibc
import IPCCore
import IPCFileCoordination
import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// Wakes a client's journal reader on the process's event loop: a watch for `IN_MODIFY` (a
/// writer's ring, or its write of a large record) on the process's one inotify instance
/// (``JournalInotify``), which the loop reads. No thread of its own, and no inotify instance per
/// connection (a user has 128 by default, `fs.inotify.max_user_instances`; watches are many more,
/// `fs.inotify.max_user_watches`): the reads it starts run on the loop's thread, and a read that
/// finds the journal locked tries again from a loop timer (``JournalRetry``).
final class JournalWatch: Sendable {
    private let inotify: JournalInotify
    private let descriptor: CInt

    /// - Parameter didChange: runs on the loop's thread after the journal changed.
    /// - Throws: ``IPCError/Code/transportFailure`` if the journal cannot be watched (naming
    ///   `fs.inotify.max_user_watches` or `max_user_instances` when one of them ran out).
    init(path: String, loop: EventLoop, didChange: @escaping @Sendable () -> Void) throws {
        inotify = try JournalInotify.shared(loop)
        descriptor = try inotify.watch(path, didChange)
    }

    /// Stops watching, once; `didChange` does not start afterwards, unless the loop is about to
    /// call it right now (once more, harmlessly: a read of an ended connection reads nothing).
    func cancel() {
        inotify.unwatch(descriptor)
    }

    deinit {
        cancel()
    }
}

/// The process's inotify instance for journals, read by the event loop, with the handler of
/// each watch.
final class JournalInotify: @unchecked Sendable {
    // @unchecked: `buffer` is used on the loop's thread only; the rest is immutable or a Mutex.
    private let inotify: CInt
    /// Where events are read to, once for the process's life: a buffer made per wake would be
    /// an allocation per message.
    private let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 8)
    /// Each watch's handler, in a box: a closure kept in a dictionary comes back wrapped in a
    /// reabstraction thunk, an allocation per wake.
    private let handlers = Mutex<[CInt: Handler]>([:])

    private final class Handler: Sendable {
        let call: @Sendable () -> Void
        init(_ call: @escaping @Sendable () -> Void) { self.call = call }
    }
    private static let instance = Mutex<JournalInotify?>(nil)

    /// The instance, made (and registered with `loop`) the first time.
    static func shared(_ loop: EventLoop) throws -> JournalInotify {
        try instance.withLock { instance in
            if let instance { return instance }
            let made = try JournalInotify(loop: loop)
            instance = made
            return made
        }
    }

    private init(loop: EventLoop) throws {
        let inotify = try Inotify.instance(watching: "journals")
        self.inotify = inotify
        do {
            // For the life of the process, as the loop's.
            _ = try loop.watchReadable(FileDescriptor(rawValue: inotify), label: "the file-presenter clients' journal reads") { [self] in
                readEvents()
            }
        } catch {
            try? FileDescriptor(rawValue: inotify).close()
            throw error
        }
    }

    /// Watches `path`; `handler` runs on the loop's thread after it changed.
    func watch(_ path: String, _ handler: @escaping @Sendable () -> Void) throws -> CInt {
        let descriptor = try Inotify.watch(inotify, path, mask: UInt32(IN_MODIFY), naming: path)
        handlers.withLock { $0[descriptor] = Handler(handler) }
        return descriptor
    }

    func unwatch(_ descriptor: CInt) {
        guard handlers.withLock({ $0.removeValue(forKey: descriptor) }) != nil else { return }
        _ = inotify_rm_watch(inotify, descriptor)
    }

    /// Reads the queued events and runs the handler of each journal they name (loop thread):
    /// one `read` when the events fit the buffer (the loop is level-triggered, so any left, or
    /// any that come meanwhile, are reported again), and one call per run of events for the same
    /// journal, which is what a message makes.
    private func readEvents() {
        var last: CInt = -1
        while true {
            let count = read(inotify, buffer.baseAddress, buffer.count)
            guard count > 0 else { return }
            var offset = 0
            while offset + MemoryLayout<inotify_event>.size <= count {
                let event = buffer.baseAddress!.advanced(by: offset).loadUnaligned(as: inotify_event.self)
                offset += MemoryLayout<inotify_event>.size + Int(event.len)
                if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                    // The kernel's queue for this instance (fs.inotify.max_queued_events) ran
                    // over and dropped events: any journal may have changed unseen, so every
                    // watch's reader looks.
                    for handler in handlers.withLock({ Array($0.values) }) { handler.call() }
                    last = -1
                    continue
                }
                guard event.wd != last else { continue }
                last = event.wd
                // Looked up now: a watch removed meanwhile is not called.
                handlers.withLock { $0[event.wd] }?.call()
            }
            // Room was left for another event (at most 16 + NAME_MAX + 1 bytes): nothing more
            // was queued when the kernel filled it.
            guard buffer.count - count < MemoryLayout<inotify_event>.size + 256 else { return }
        }
    }
}

/// When a read on the loop found the journal locked (a writer appending, or compaction), the
/// next try: 10 µs, doubling to 1 ms, from a loop timer, so that the loop never waits for a
/// lock. A writer stopped while it holds the lock costs the loop one try a millisecond.
struct JournalRetry {
    private var delay: UInt64 = 0

    /// The delay before the next try, after one more that found the lock taken.
    mutating func next() -> UInt64 {
        delay = delay == 0 ? 10_000 : min(delay * 2, 1_000_000)
        return delay
    }

    /// A read got through.
    mutating func reset() {
        delay = 0
    }
}

