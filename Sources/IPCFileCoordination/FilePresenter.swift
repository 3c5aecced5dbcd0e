import CIPCShims
import Dispatch
import Glibc
public import IPCCore
import IPCEngine
import IPCSystem
import Synchronization
import SystemPackage

/// Tells when a file's contents change: the counterpart of `NSFilePresenter` and its
/// `presentedItemDidChange()`.
///
/// A presenter watches the file with inotify for `IN_MODIFY`, which the kernel reports for writes
/// and truncations only: attribute changes (a `touch`, a `chmod`) are `IN_ATTRIB` and are not
/// reported. No presenter has a thread of its own: the process's event loop
/// (``EventLoop/shared()``) reads one inotify instance that watches the files of all the
/// process's presenters, and the answering sockets below, and only hands work on. Each
/// presenter's callbacks run on a serial dispatch queue of its own, off the loop, one at a time
/// and in order: a callback that blocks holds up its own presenter and one of Dispatch's
/// threads, never the loop's connections (other presenters go on while Dispatch has threads to
/// give them, which it adds slowly and up to a limit). `didChange` runs there once a changing write is complete: on seeing a
/// change the presenter's queue waits for the file's shared lock (so a coordinated write has
/// finished), takes the events that write made meanwhile, and then calls once. Writes that
/// follow each other closely may be reported by one call.
///
/// Writes made through a ``FileCoordinator`` created with this presenter are not reported. The
/// coordinator brackets each of its writes, while it holds the file's exclusive lock, with two
/// events on a private marker file watched by the same inotify instance (a read for the start,
/// a write for the end). One inotify instance queues the events of all its watches in the order
/// they happened, and no other coordinated write can fall inside a bracket, so the presenter
/// skips exactly the changes between a start and its end. Writes by other coordinators (other
/// processes, or other coordinators in this one) are reported. If the kernel's event queue
/// overflows, a change is reported (to every presenter of the process), since one may have been
/// lost.
///
/// After ``remove()`` returns, `didChange` does not start again (a call already running on
/// another thread is waited for; a call to `remove()` from inside `didChange` is allowed).
/// A presenter that is no longer referenced removes itself. The presenter keeps the file open,
/// so it goes on presenting the same file even if the file is renamed or unlinked, and it
/// follows a rename by any process, as `NSFilePresenter` does: ``path`` becomes the new path,
/// a presenter that answers coordinators moves its answering socket to the presenters directory
/// beside the new path (so coordinated accesses at the new path ask it, and those at the old
/// one no longer do), and then `didMove` (`presentedItemDidMove(to:)`) runs with the new path.
/// `accommodateDeletion` (`accommodatePresentedItemDeletion`) runs once, after the file's last
/// name is removed. Both run on the presenter's queue, like `didChange`, and not after
/// ``remove()``. Between a rename and the presenter's queue seeing it (after the loop reads its
/// inotify event) a coordinated access at the new path does not find the presenter yet.
///
/// A presenter with a save or relinquish callback answers coordinated accesses made in any
/// process by coordinators other than its own (see ``FileCoordinator``): it binds a socket in
/// the file's presenters directory (``PresenterDirectory``), which the event loop watches, with
/// each coordinator's conversation; the presenter's queue runs the callback asked for and
/// answers, and runs the reacquirer when the access is over, or when the process that made it
/// dies. All callbacks of one presenter run on its queue, one at a time.
public final class FilePresenter: FilePresentation {
    /// Where the presented file is: the path it was presented at, then the path of each rename
    /// as the presenter's queue sees it (before `didMove` runs).
    public var path: String { core.path }
    /// The socket through which coordinators ask this presenter; `nil` if it answers none.
    var answeringSocket: String? { core.answeringPath }
    private let core: PresenterCore

    /// Starts presenting the existing file at `path`.
    /// - Throws: ``IPCError/Code/transportFailure`` if the file does not exist or cannot be
    ///   watched (for example when `fs.inotify.max_user_watches` is exhausted), or its
    ///   presenters directory cannot be used; ``IPCError/Code/accessDenied`` if that directory
    ///   belongs to another user or is open to others.
    public init(presenting path: String, callbacks: FilePresenterCallbacks) throws {
        core = try PresenterCore(path: path, callbacks: callbacks)
    }

    /// Starts presenting the existing file at `path`, told of changes, renames and deletion.
    /// - Throws: what ``init(presenting:callbacks:)`` throws.
    public convenience init(
        presenting path: String, didChange: @escaping @Sendable () -> Void,
        didMove: (@Sendable (_ newPath: String) -> Void)? = nil, accommodateDeletion: (@Sendable () -> Void)? = nil
    ) throws {
        try self.init(presenting: path, callbacks: FilePresenterCallbacks(didChange: didChange, didMove: didMove, accommodateDeletion: accommodateDeletion))
    }

    deinit {
        // Nobody can see a call that is still running finish: no need to wait for it (waiting
        // could block whoever dropped the last reference on what that call waits for).
        core.remove(waiting: false)
    }

    /// Stops reporting changes. Idempotent.
    public func remove() {
        core.remove()
    }

    func beginOwnWrite() {
        core.mark(.begin)
    }

    func endOwnWrite() {
        core.mark(.end)
    }
}

/// The events on the marker file that bracket a coordinated write of the presenter's own.
private enum MarkerEvent {
    /// `IN_ACCESS`, made by reading the marker's one byte.
    case begin
    /// `IN_MODIFY`, made by writing it.
    case end
}

/// What the presenter's queue made of a coordinator's request.
private enum PresenterOutcome {
    case done(FilePresenterCallbacks.Reacquirer?)
    case failed
    /// The presenter was removed: the conversation ends unanswered, as if it had died.
    case gone
}

/// A presenter's listening socket in the file's presenters directory. Its name is removed by
/// whoever stops using it (``PresenterCore``), off the event loop; the socket closes with it.
private final class AnsweringSocket: Sendable {
    let listener: FileDescriptor
    let path: String

    init(presenting file: String) throws {
        (listener, path) = try PresenterDirectory(presenting: file).register()
    }

    deinit {
        try? listener.close()
    }
}

/// Everything behind one ``FilePresenter``. The event loop hands it the events of its watches
/// (``PresenterInotify``) and the requests of its conversations (``Conversations``); its
/// serial queue does the rest: waits for writers, follows renames, runs every callback.
private final class PresenterCore: @unchecked Sendable {
    // @unchecked: `knownPath` and `deletionReported` are touched on `queue` only (and by the
    // initializer before anything can run there); everything else is immutable, a Mutex or an
    // Atomic.

    /// The presented file, locked (shared) to wait until a write to it is complete.
    private let file: CoordinatedFile
    private let marker: CInt
    private let callbacks: FilePresenterCallbacks
    private let inotify: PresenterInotify
    /// Runs the callbacks, one at a time and in order, and everything that may wait: a serial
    /// queue on Dispatch's threads, so a blocked presenter never holds up the event loop (see
    /// the type's comment for the other presenters).
    private let queue = DispatchQueue(label: "ipc-presenter")
    /// What the loop saw and the queue has not looked at yet.
    private let events: Mutex<EventState>
    /// The conversations with coordinators, for a presenter that answers them.
    private let conversations: Conversations?
    /// The answering socket's name: replaced when the file is renamed (the queue), `nil` once
    /// the presenter is removed (or if it answers nobody).
    private let socketName: Mutex<String?>
    /// The presented file's path, as of the last rename the queue saw.
    private let currentPath: Mutex<String>
    private let removed = Atomic<Bool>(false)
    /// The `pthread_t` running a callback now, so that `remove()` knows when it is called from one.
    private let runningOn = Atomic<UInt>(0)
    /// Held while a callback runs, so that `remove()` can wait for a call in progress.
    private let gate = Mutex(())
    private var knownPath: String?
    private var deletionReported = false

    init(path: String, callbacks: FilePresenterCallbacks) throws {
        self.callbacks = callbacks
        let loop = try EventLoop.shared()
        inotify = try PresenterInotify.shared(loop)
        file = try CoordinatedFile(path: path, create: false)
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) }.flatMap { $0.isEmpty ? "/" : $0 } ?? "."
        marker = ipc_open_unnamed_file(directory)
        guard marker >= 0 else { throw IPCError.syscall("open(O_TMPFILE)", Errno(rawValue: errno), context: directory) }
        var byte: UInt8 = 0
        _ = pwrite(marker, &byte, 1, 0)
        let answering: AnsweringSocket?
        do {
            answering = callbacks.answersCoordinators ? try AnsweringSocket(presenting: path) : nil
        } catch {
            try? FileDescriptor(rawValue: marker).close()
            throw error
        }
        socketName = Mutex(answering?.path)
        currentPath = Mutex(path)
        events = Mutex(EventState(reportsChanges: callbacks.didChange != nil, reportsAttributes: callbacks.accommodateDeletion != nil))
        conversations = answering.map { Conversations(listener: $0, loop: loop) }
        knownPath = namedPath()
        do {
            // IN_MOVE_SELF for renames, which the presenter follows; only for a presenter that
            // asks, IN_MODIFY for changes and IN_ATTRIB for unlinks, which change the link count
            // (the file is kept open, so IN_DELETE_SELF would come only once it is closed).
            let mask = UInt32(IN_MOVE_SELF) | (callbacks.didChange == nil ? 0 : UInt32(IN_MODIFY))
                | (callbacks.accommodateDeletion == nil ? 0 : UInt32(IN_ATTRIB))
            try inotify.watch(self, file: file.descriptor, marker: marker, mask: mask)
            try conversations?.start(presenter: self)
        } catch {
            removed.store(true, ordering: .releasing)
            retire()
            throw error
        }
    }

    deinit {
        try? FileDescriptor(rawValue: marker).close()
    }

    func mark(_ event: MarkerEvent) {
        var byte: UInt8 = 0
        switch event {
        case .begin: _ = pread(marker, &byte, 1, 0)
        case .end: _ = pwrite(marker, &byte, 1, 0)
        }
    }

    var path: String { currentPath.withLock { $0 } }

    var answeringPath: String? { socketName.withLock { $0 } }

    func remove(waiting: Bool = true) {
        if !removed.exchange(true, ordering: .acquiringAndReleasing) { retire() }
        // From inside a callback the gate is ours already; from elsewhere, taking it waits for a
        // call in progress (no call starts once the flag is set: it is checked under the gate).
        if waiting, runningOn.load(ordering: .acquiring) != UInt(pthread_self()) {
            gate.withLock { _ in }
        }
    }

    /// Stops everything once `removed` is set: the socket's name goes, so that no coordinator
    /// finds it any more, the watches go, and every conversation ends unanswered, also those
    /// still waiting to be accepted: their coordinators see the end at once, as for a presenter
    /// that died, instead of waiting for their timeouts.
    private func retire() {
        socketName.withLock { name in
            if let name { unlink(name) }
            name = nil
        }
        inotify.unwatch(self)
        conversations?.closeAll()
    }

    // MARK: Events (handed over by whoever reads the inotify instance)

    /// An event of the file's watch (or, `onMarker`, of the marker's), in the order of the queue.
    func take(_ mask: UInt32, onMarker: Bool) {
        if events.withLock({ $0.take(mask, onMarker: onMarker) }) { scheduleLook() }
    }

    /// The kernel's event queue overflowed: events were lost, markers perhaps among them.
    func overflowed() {
        if events.withLock({ $0.overflowed() }) { scheduleLook() }
    }

    private func scheduleLook() {
        queue.async { [self] in look() }
    }

    /// Looks at what the loop saw (the queue): follows a rename, tells a deletion, and reports a
    /// change once the write that made it is complete.
    private func look() {
        let seen = events.withLock { $0.takeAll() }
        guard !removed.load(ordering: .acquiring) else { return }
        if seen.moved, let now = namedPath(), now != knownPath {
            knownPath = now
            follow(to: now)
            if let didMove = callbacks.didMove { call { didMove(now) } }
        }
        if seen.attributesChanged, let accommodateDeletion = callbacks.accommodateDeletion, !deletionReported {
            var status = stat()
            if fstat(file.descriptor, &status) == 0, status.st_nlink == 0 {
                deletionReported = true
                call(accommodateDeletion)
            }
        }
        // A few rounds at most, so that a stream of writes cannot postpone the call forever.
        var rounds = 0
        while seen.changed, rounds < 8, waitForWriters() {
            rounds += 1
            // The write is complete: take the events it made meanwhile (the loop may not have
            // read them yet), so that one call reports them, and own writes are told apart.
            inotify.readAll()
            guard events.withLock({ $0.takeChange() }) else { break }
        }
        if seen.changed, let didChange = callbacks.didChange { call(didChange) }
        if seen.watchEnded, !removed.exchange(true, ordering: .acquiringAndReleasing) {
            // The kernel ended the watch (the file system went away): nothing more will come.
            retire()
        }
    }

    /// Runs `callback` under the gate, unless the presenter was removed (the queue).
    @discardableResult
    private func call<T: Sendable>(_ callback: () -> T) -> T? {
        gate.withLock { _ -> T? in
            guard !removed.load(ordering: .acquiring) else { return nil }
            runningOn.store(UInt(pthread_self()), ordering: .releasing)
            defer { runningOn.store(0, ordering: .releasing) }
            return callback()
        }
    }

    // MARK: Coordinators' requests (handed over by the loop)

    /// Runs the callback a coordinator asked for on the queue, then gives `reply` the outcome
    /// (on the queue).
    func answer(_ request: PresenterRequest, reply: @escaping @Sendable (PresenterOutcome) -> Void) {
        queue.async { [self] in reply(call { respond(to: request) } ?? .gone) }
    }

    /// Runs a reacquirer on the queue, after what is queued, unless the presenter was removed.
    func reacquire(_ reacquirer: @escaping FilePresenterCallbacks.Reacquirer) {
        queue.async { [self] in call(reacquirer) }
    }

    private func respond(to request: PresenterRequest) -> PresenterOutcome {
        switch request {
        case .save:
            guard let save = callbacks.savePresentedItemChanges else { return .done(nil) }
            do {
                try save()
                return .done(nil)
            } catch {
                return .failed
            }
        case .relinquishToReader:
            return .done(callbacks.relinquishToReader?())
        case .relinquishToWriter:
            return .done(callbacks.relinquishToWriter?())
        }
    }

    /// The file was renamed to `now` (the queue): the path follows, and the answering socket
    /// moves to the presenters directory beside the new name. Coordinators still connecting to
    /// the old socket are closed, as for a presenter gone from there. If the new directory
    /// cannot be used (it is another user's, or open to others), the presenter answers nobody
    /// from then on rather than trust it.
    private func follow(to now: String) {
        currentPath.withLock { $0 = now }
        guard let conversations, !removed.load(ordering: .acquiring) else { return }
        let moved = try? AnsweringSocket(presenting: now)
        // Under the name's lock, which `retire()` takes after setting `removed`: a socket made
        // while the presenter was being removed is not left behind.
        let kept = socketName.withLock { name -> Bool in
            guard !removed.load(ordering: .acquiring) else { return false }
            if let name { unlink(name) }
            name = moved?.path
            return true
        }
        guard kept else {
            if let moved { unlink(moved.path) }
            return
        }
        conversations.move(to: moved)
    }

    /// Where the presented file is now, as the kernel names its open descriptor; `nil` once it has
    /// no name (the kernel then appends " (deleted)", which is not a path).
    private func namedPath() -> String? {
        var target = [CChar](repeating: 0, count: Int(PATH_MAX))
        let count = readlink("/proc/self/fd/\(file.descriptor)", &target, target.count - 1)
        guard count > 0 else { return nil }
        let path = String(decoding: target.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return path.hasSuffix(" (deleted)") ? nil : path
    }

    /// Waits until no coordinated write holds the file (a writer that dies releases it).
    /// Returns `false` if the presenter was removed meanwhile.
    private func waitForWriters() -> Bool {
        while !removed.load(ordering: .acquiring) {
            do {
                try file.lock(exclusive: false, timeout: .milliseconds(100))
                file.unlock()
                return true
            } catch let error as IPCError where error.code == .coordinationTimeout {
                continue
            } catch {
                return true
            }
        }
        return false
    }
}

/// The process's one inotify instance for presenters, read by the event loop: it watches each
/// presenter's file and marker (a user has 128 instances by default,
/// `fs.inotify.max_user_instances`; watches are many more). The loop reads it when it is
/// readable; a presenter's queue reads it too, after a write is complete. Whoever reads hands
/// each event to the presenters of its watch, in order, under one lock.
///
/// Two presenters of one file share the kernel's watch (one per inode and instance): its mask
/// is the union of theirs, and it is removed with the last of them.
private final class PresenterInotify: Sendable {
    private enum Role {
        case file
        case marker
    }

    private struct Watcher {
        let presenter: PresenterCore
        let role: Role
    }

    private let descriptor: CInt
    /// Where events are read to, for the life of the process; its lock keeps one reader at a
    /// time, so that each presenter takes its events in the order they happened.
    private let reader = Mutex(UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 8))
    /// The presenters of each watch descriptor.
    private let watchers = Mutex<[CInt: [Watcher]]>([:])
    private let loop: EventLoop
    /// The loop's registration of ``descriptor``, paused while a presenter's queue reads.
    private let readWatch = Mutex<EventLoop.ReadinessWatch?>(nil)

    private static let instance = Mutex<PresenterInotify?>(nil)

    /// The instance, made (and registered with `loop`) the first time.
    /// - Throws: ``IPCError/Code/transportFailure`` (naming `fs.inotify.max_user_instances` when
    ///   this user's ran out); the next call tries again.
    static func shared(_ loop: EventLoop) throws -> PresenterInotify {
        try instance.withLock { instance in
            if let instance { return instance }
            let made = try PresenterInotify(loop: loop)
            instance = made
            return made
        }
    }

    private init(loop: EventLoop) throws {
        let descriptor = try Inotify.instance(watching: "presented files")
        self.descriptor = descriptor
        self.loop = loop
        do {
            // For the life of the process, as the loop's. One read a wake: the loop is
            // level-triggered, so what is left is reported again. None while a presenter's
            // queue is reading (the loop never waits for that lock): the queue takes what is
            // queued, and the loop looks again shortly, rather than at once and again.
            let watch = try loop.watchReadable(FileDescriptor(rawValue: descriptor), label: "the file presenters' inotify reads") { [self] in
                guard !readIfFree(), let watch = readWatch.withLock({ $0 }) else { return }
                self.loop.pause(watch, for: .microseconds(200))
            }
            readWatch.withLock { $0 = watch }
        } catch {
            try? FileDescriptor(rawValue: descriptor).close()
            throw error
        }
    }

    /// Starts handing `presenter` the events of `file` (for `mask`) and of `marker`.
    /// - Throws: ``IPCError/Code/transportFailure`` (naming `fs.inotify.max_user_watches` when
    ///   this user's ran out).
    func watch(_ presenter: PresenterCore, file: CInt, marker: CInt, mask: UInt32) throws {
        // Under the lock, so that no other presenter of the same file removes the shared watch
        // between its making and its entry, nor an event is looked up before the entry.
        try watchers.withLock { table in
            // The open descriptors, not paths: the very files the presenter holds.
            let fileWatch = try Inotify.watch(descriptor, "/proc/self/fd/\(file)", mask: mask | UInt32(IN_MASK_ADD), naming: "a presented file")
            let markerWatch: CInt
            do {
                markerWatch = try Inotify.watch(descriptor, "/proc/self/fd/\(marker)", mask: UInt32(IN_ACCESS) | UInt32(IN_MODIFY), naming: "a presenter's marker file")
            } catch {
                if table[fileWatch] == nil { _ = inotify_rm_watch(descriptor, fileWatch) }
                throw error
            }
            table[fileWatch, default: []].append(Watcher(presenter: presenter, role: .file))
            table[markerWatch, default: []].append(Watcher(presenter: presenter, role: .marker))
        }
    }

    /// Stops handing `presenter` events; a watch nobody else uses is removed.
    func unwatch(_ presenter: PresenterCore) {
        watchers.withLock { table in
            for (watch, list) in table where list.contains(where: { $0.presenter === presenter }) {
                let rest = list.filter { $0.presenter !== presenter }
                if rest.isEmpty {
                    table[watch] = nil
                    _ = inotify_rm_watch(descriptor, watch)
                } else {
                    table[watch] = rest
                }
            }
        }
    }

    /// Reads until nothing is queued (a presenter's queue, after a write is complete), or as
    /// much as the kernel queues by default (`fs.inotify.max_queued_events`, 16384 events of 16
    /// bytes: 16 buffers).
    func readAll() {
        read(atMost: 16)
    }

    /// One read, if no presenter's queue is reading now (the loop); returns whether it read.
    private func readIfFree() -> Bool {
        reader.withLockIfAvailable { buffer in read(atMost: 1, into: buffer) } != nil
    }

    private func read(atMost reads: Int) {
        reader.withLock { buffer in read(atMost: reads, into: buffer) }
    }

    /// Reads what is queued, at most `reads` times, and hands each event to the presenters of
    /// its watch, in order. Never waits for the kernel. Under `reader`'s lock.
    private func read(atMost reads: Int, into buffer: UnsafeMutableRawBufferPointer) {
        for _ in 0..<reads {
            let count = Glibc.read(descriptor, buffer.baseAddress, buffer.count)
            guard count > 0 else { return }
            deliver(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
    }

    private func deliver(_ bytes: UnsafeRawBufferPointer) {
        // Looked up after the read: a watch made before the read has its entry by now.
        let table = watchers.withLock { $0 }
        var ended: [CInt] = []
        var offset = 0
        while offset + MemoryLayout<inotify_event>.size <= bytes.count {
            let event = bytes.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
            offset += MemoryLayout<inotify_event>.size + Int(event.len)
            if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                for list in table.values {
                    for watcher in list where watcher.role == .file { watcher.presenter.overflowed() }
                }
                continue
            }
            guard let list = table[event.wd] else { continue }
            for watcher in list { watcher.presenter.take(event.mask, onMarker: watcher.role == .marker) }
            // The kernel removed the watch (nobody here did, or it would have no entry).
            if event.mask & UInt32(IN_IGNORED) != 0 { ended.append(event.wd) }
        }
        if !ended.isEmpty {
            watchers.withLock { table in ended.forEach { table[$0] = nil } }
        }
    }
}

/// The coordinators' conversations with one presenter that answers them. The event loop accepts
/// on the listening socket and reads each conversation, one byte at a time and never waiting;
/// the presenter's queue runs the callback a request asks for, and sends the answer from there.
/// Each conversation asks one thing; a relinquish stays open until its access is over (the
/// coordinator closes it, or its process dies), and then the reacquirer runs. At most
/// ``PresenterDirectory/maximumConversations`` are open; more connections wait in the
/// listener's backlog.
///
/// Every use of these descriptors is made under `state`'s lock, and a conversation is looked up
/// by a number never reused: one that ends on another thread (``closeAll()``, a move) is never
/// read or written after its descriptor closes.
private final class Conversations: Sendable {
    private enum Phase {
        case asking
        /// The presenter's queue has the request; the conversation is not watched meanwhile.
        case answering
        /// The presenter relinquished: waiting for the end of the access.
        case relinquished(FilePresenterCallbacks.Reacquirer?)

        var isAnswering: Bool {
            if case .answering = self { return true }
            return false
        }
    }

    private struct Conversation {
        let descriptor: FileDescriptor
        var watch: EventLoop.ReadinessWatch?
        var phase: Phase
    }

    private struct State {
        /// `nil` before ``start(presenter:)`` and after ``closeAll()``.
        var presenter: PresenterCore?
        var listener: AnsweringSocket?
        /// `nil` while the listener is not watched (at the limit of conversations).
        var listenerWatch: EventLoop.ReadinessWatch?
        var open: [UInt64: Conversation] = [:]
        var serial: UInt64 = 0
    }

    private let loop: EventLoop
    private let state: Mutex<State>

    init(listener: AnsweringSocket, loop: EventLoop) {
        self.loop = loop
        state = Mutex(State(listener: listener))
    }

    /// Starts accepting, for `presenter` (which this holds until ``closeAll()``).
    /// - Throws: ``IPCError/Code/transportFailure`` if the loop cannot watch the socket.
    func start(presenter: PresenterCore) throws {
        try state.withLock { state in
            state.presenter = presenter
            try watchListener(&state)
        }
    }

    /// Moves to the socket `moved`, or to none (the queue, after a rename): connections waiting
    /// in the old one's backlog are closed; the open conversations go on.
    func move(to moved: AnsweringSocket?) {
        state.withLock { state in
            guard state.presenter != nil else { return }
            if let old = state.listener {
                stopWatchingListener(&state)
                Self.refuseWaiting(on: old.listener)
            }
            state.listener = moved
            try? watchListener(&state)
        }
    }

    /// Ends every conversation without answering or reacquiring, and those waiting to be
    /// accepted; closes the listener. Idempotent.
    func closeAll() {
        state.withLock { state in
            state.presenter = nil
            stopWatchingListener(&state)
            let listener = state.listener.take()
            for id in Array(state.open.keys) { end(id, &state) }
            if let listener { Self.refuseWaiting(on: listener.listener) }
        }
    }

    private func watchListener(_ state: inout State) throws {
        guard state.presenter != nil, state.listenerWatch == nil, let listener = state.listener,
            state.open.count < PresenterDirectory.maximumConversations
        else { return }
        state.listenerWatch = try loop.watchReadable(listener.listener, label: "a file presenter's answering socket") { [self] in
            accept()
        }
    }

    private func stopWatchingListener(_ state: inout State) {
        if let watch = state.listenerWatch.take() { loop.cancel(watch) }
    }

    /// Accepts the connections waiting (the loop).
    private func accept() {
        state.withLock { state in
            guard let listener = state.listener, let listenerWatch = state.listenerWatch else { return }
            while state.open.count < PresenterDirectory.maximumConversations {
                let outcome: UnixSocket.AcceptOutcome
                do {
                    outcome = try UnixSocket.acceptIfReady(listener.listener)
                } catch {
                    // A shortage (the descriptor table full): the connections stay queued; look
                    // again later rather than spin the loop on a socket that stays readable.
                    loop.pause(listenerWatch, for: .milliseconds(100))
                    return
                }
                guard case .accepted(let descriptor) = outcome else { return }
                guard let peer = try? UnixSocket.peerCredentials(descriptor), peer.uid == geteuid() else {
                    try? descriptor.close()
                    continue
                }
                state.serial += 1
                guard let conversationWatch = try? watch(descriptor, as: state.serial) else {
                    try? descriptor.close()
                    continue
                }
                state.open[state.serial] = Conversation(descriptor: descriptor, watch: conversationWatch, phase: .asking)
            }
            // At the limit: until a conversation ends, new connections wait in the backlog.
            stopWatchingListener(&state)
        }
    }

    private func watch(_ descriptor: FileDescriptor, as id: UInt64) throws -> EventLoop.ReadinessWatch {
        try loop.watchReadable(descriptor, label: "a coordinator asking a file presenter") { [self] in
            readable(id)
        }
    }

    /// Conversation `id` has something to read (the loop).
    private func readable(_ id: UInt64) {
        state.withLock { state in
            // Answering, it is not watched: nothing is read from it until the answer is sent.
            guard var conversation = state.open[id], let presenter = state.presenter, !conversation.phase.isAnswering else { return }
            let received = receiveByte(conversation.descriptor)
            if received == .notYet { return }
            switch conversation.phase {
            case .relinquished(let reacquirer):
                // The end of the access (a close, or a death), or bytes the protocol has none of.
                end(id, &state)
                reacquirer.map(presenter.reacquire)
            case .asking:
                guard case .byte(let byte) = received, let request = PresenterRequest(rawValue: byte) else {
                    end(id, &state)
                    return
                }
                if let watch = conversation.watch.take() { loop.cancel(watch) }
                conversation.phase = .answering
                state.open[id] = conversation
                presenter.answer(request) { [self] outcome in answered(id, request, outcome) }
            case .answering:
                return
            }
        }
    }

    /// The presenter's queue answered conversation `id` (on the queue).
    private func answered(_ id: UInt64, _ request: PresenterRequest, _ outcome: PresenterOutcome) {
        state.withLock { state in
            // Ended meanwhile: the presenter was removed, and reacquires nothing.
            guard var conversation = state.open[id], let presenter = state.presenter else { return }
            var reply: UInt8
            var reacquirer: FilePresenterCallbacks.Reacquirer?
            switch outcome {
            case .done(let returned):
                reply = PresenterAnswer.done.rawValue
                reacquirer = returned
            case .failed:
                reply = PresenterAnswer.failed.rawValue
            case .gone:
                end(id, &state)
                return
            }
            let relinquished = request != .save && reply == PresenterAnswer.done.rawValue
            if send(conversation.descriptor.rawValue, &reply, 1, CInt(MSG_NOSIGNAL | MSG_DONTWAIT)) == 1, relinquished,
                let watch = try? watch(conversation.descriptor, as: id)
            {
                conversation.watch = watch
                conversation.phase = .relinquished(reacquirer)
                state.open[id] = conversation
                return
            }
            end(id, &state)
            // A coordinator gone before the answer: its access is over already. (Also one whose
            // end cannot be watched, the loop refusing: better reacquire early than never.)
            if relinquished { reacquirer.map(presenter.reacquire) }
        }
    }

    /// Closes conversation `id`; below the limit again, the listener is watched again.
    private func end(_ id: UInt64, _ state: inout State) {
        guard let conversation = state.open.removeValue(forKey: id) else { return }
        if let watch = conversation.watch { loop.cancel(watch) }
        try? conversation.descriptor.close()
        try? watchListener(&state)
    }

    /// Closes the connections waiting in `listener`'s backlog unanswered (a listener the
    /// presenter leaves).
    private static func refuseWaiting(on listener: FileDescriptor) {
        while case .accepted(let descriptor) = (try? UnixSocket.acceptIfReady(listener)) ?? .none {
            try? descriptor.close()
        }
    }
}

/// What the loop saw of one presenter's watches and its queue has not looked at yet; the
/// marker's events tell the presenter's own writes (between a begin and an end) from everyone
/// else's.
private struct EventState {
    /// Whether changes count (a presenter told of them: no other waits for writers).
    let reportsChanges: Bool
    /// Whether attribute changes count (a presenter told of deletions).
    let reportsAttributes: Bool
    var insideOwnWrite = false
    /// A write by someone else (or an overflow).
    var changed = false
    /// The file was renamed (IN_MOVE_SELF).
    var moved = false
    /// The file's attributes, its link count among them, changed (IN_ATTRIB).
    var attributesChanged = false
    /// The kernel removed the file's watch (IN_IGNORED).
    var watchEnded = false
    /// A look is queued that has not taken the flags yet.
    var lookQueued = false

    init(reportsChanges: Bool, reportsAttributes: Bool) {
        self.reportsChanges = reportsChanges
        self.reportsAttributes = reportsAttributes
    }

    /// Takes one event; returns whether a look must be queued.
    mutating func take(_ mask: UInt32, onMarker: Bool) -> Bool {
        if onMarker {
            insideOwnWrite = mask & UInt32(IN_ACCESS) != 0
            return false
        }
        if mask & UInt32(IN_MODIFY) != 0, !insideOwnWrite, reportsChanges { changed = true }
        if mask & UInt32(IN_IGNORED) != 0 { watchEnded = true }
        if mask & UInt32(IN_MOVE_SELF) != 0 { moved = true }
        if mask & UInt32(IN_ATTRIB) != 0, reportsAttributes { attributesChanged = true }
        return queueLook()
    }

    /// Events were lost, markers perhaps among them: a change is reported.
    mutating func overflowed() -> Bool {
        if reportsChanges { changed = true }
        insideOwnWrite = false
        return queueLook()
    }

    private mutating func queueLook() -> Bool {
        guard changed || moved || attributesChanged || watchEnded, !lookQueued else { return false }
        lookQueued = true
        return true
    }

    /// What a look takes (the presenter's queue).
    struct Seen {
        var changed: Bool
        var moved: Bool
        var attributesChanged: Bool
        var watchEnded: Bool
    }

    mutating func takeAll() -> Seen {
        defer {
            (changed, moved, attributesChanged, watchEnded, lookQueued) = (false, false, false, false, false)
        }
        return Seen(changed: changed, moved: moved, attributesChanged: attributesChanged, watchEnded: watchEnded)
    }

    /// Takes a change seen since the look began.
    mutating func takeChange() -> Bool {
        defer { changed = false }
        return changed
    }
}
