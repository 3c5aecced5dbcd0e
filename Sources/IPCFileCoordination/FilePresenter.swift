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
/// reported. `didChange` runs on the presenter's own thread once a changing write is complete:
/// on seeing a change the presenter waits for the file's shared lock (so a coordinated write has
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
/// overflows, a change is reported, since one may have been lost.
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
/// name is removed. Both run on the presenter's thread, like `didChange`, and not after
/// ``remove()``. Between a rename and the presenter's thread seeing it (its next inotify read)
/// a coordinated access at the new path does not find the presenter yet.
///
/// A presenter with a save or relinquish callback answers coordinated accesses made in any
/// process by coordinators other than its own (see ``FileCoordinator``): it binds a socket in
/// the file's presenters directory (``PresenterDirectory``), and its thread runs the callback
/// asked for, answers, and runs the reacquirer when the access is over, or when the process
/// that made it dies. All callbacks run on the presenter's one thread, one at a time.
public final class FilePresenter: FilePresentation {
    /// Where the presented file is: the path it was presented at, then the path of each rename
    /// as the presenter's thread sees it (before `didMove` runs).
    public var path: String { watch.path }
    /// The socket through which coordinators ask this presenter; `nil` if it answers none.
    var answeringSocket: String? { watch.answeringPath }
    private let watch: PresenterWatch

    /// Starts presenting the existing file at `path`.
    /// - Throws: ``IPCError/Code/transportFailure`` if the file does not exist or cannot be
    ///   watched (for example when `fs.inotify.max_user_watches` is exhausted), or its
    ///   presenters directory cannot be used; ``IPCError/Code/accessDenied`` if that directory
    ///   belongs to another user or is open to others.
    public init(presenting path: String, callbacks: FilePresenterCallbacks) throws {
        watch = try PresenterWatch(path: path, callbacks: callbacks)
        try PosixThread.detach(name: "ipc-presenter") { [watch] in watch.run() }
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
        watch.remove(waiting: false)
    }

    /// Stops reporting changes. Idempotent.
    public func remove() {
        watch.remove()
    }

    func beginOwnWrite() {
        watch.mark(MarkerEvent.begin)
    }

    func endOwnWrite() {
        watch.mark(MarkerEvent.end)
    }
}

/// The events on the marker file that bracket a coordinated write of the presenter's own.
private enum MarkerEvent {
    /// `IN_ACCESS`, made by reading the marker's one byte.
    case begin
    /// `IN_MODIFY`, made by writing it (also used to wake the presenter's thread).
    case end
}

/// A presenter's listening socket in the file's presenters directory.
private final class AnsweringSocket: Sendable {
    let listener: FileDescriptor
    let path: String

    init(presenting file: String) throws {
        (listener, path) = try PresenterDirectory(presenting: file).register()
    }

    /// Removes the name, so that no coordinator finds it any more.
    func unlinkName() {
        unlink(path)
    }

    deinit {
        unlink(path)
        try? listener.close()
    }
}

/// The inotify instance and thread behind a ``FilePresenter``. The thread keeps it alive while
/// it runs; the descriptors close when both the thread and the presenter are done with it.
private final class PresenterWatch: Sendable {
    private let inotify: CInt
    /// The presented file, locked (shared) to wait until a write to it is complete.
    private let file: CoordinatedFile
    private let marker: CInt
    private let fileWatch: CInt
    private let markerWatch: CInt
    private let callbacks: FilePresenterCallbacks
    /// Where coordinators ask this presenter, for a presenter that answers them; replaced when
    /// the file is renamed (presenter thread).
    private let answering: Mutex<AnsweringSocket?>
    /// The presented file's path, as of the last rename the thread saw.
    private let currentPath: Mutex<String>
    private let removed = Atomic<Bool>(false)
    /// The presenter thread's `pthread_t`, so that `remove()` knows when it is called from `didChange`.
    private let thread = Atomic<UInt>(0)
    /// Held while `didChange` runs, so that `remove()` can wait for a call in progress.
    private let gate = Mutex(())
    init(path: String, callbacks: FilePresenterCallbacks) throws {
        self.callbacks = callbacks
        file = try CoordinatedFile(path: path, create: false)
        answering = Mutex(callbacks.answersCoordinators ? try AnsweringSocket(presenting: path) : nil)
        currentPath = Mutex(path)
        inotify = inotify_init1(CInt(IN_CLOEXEC))
        guard inotify >= 0 else { throw IPCError.syscall("inotify_init1", Errno(rawValue: errno)) }
        let directory = path.lastIndex(of: "/").map { String(path[..<$0]) }.flatMap { $0.isEmpty ? "/" : $0 } ?? "."
        marker = ipc_open_unnamed_file(directory)
        guard marker >= 0 else {
            let error = Errno(rawValue: errno)
            try? FileDescriptor(rawValue: inotify).close()
            throw IPCError.syscall("open(O_TMPFILE)", error, context: directory)
        }
        var byte: UInt8 = 0
        _ = pwrite(marker, &byte, 1, 0)
        // IN_MOVE_SELF for renames, which the presenter follows; only for a presenter that asks,
        // IN_ATTRIB for unlinks, which change the link count (the file is kept open, so
        // IN_DELETE_SELF would come only once it is closed).
        let mask = UInt32(IN_MODIFY) | UInt32(IN_MOVE_SELF) | (callbacks.accommodateDeletion == nil ? 0 : UInt32(IN_ATTRIB))
        fileWatch = inotify_add_watch(inotify, path, mask)
        markerWatch = inotify_add_watch(inotify, "/proc/self/fd/\(marker)", UInt32(IN_ACCESS) | UInt32(IN_MODIFY))
        guard fileWatch >= 0, markerWatch >= 0 else {
            let error = Errno(rawValue: errno)
            try? FileDescriptor(rawValue: inotify).close()
            try? FileDescriptor(rawValue: marker).close()
            throw IPCError.syscall("inotify_add_watch", error, context: path)
        }
    }

    deinit {
        // Closing an inotify instance waits for the kernel's fsnotify mark reaper (an SRCU grace
        // period: 10-25 ms at times on this VM kind), so it is closed off the releasing thread,
        // which may be ending a connection whose invalidation handler waits behind it.
        let inotify = inotify
        DispatchQueue.global(qos: .utility).async { try? FileDescriptor(rawValue: inotify).close() }
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

    var answeringPath: String? { answering.withLock { $0?.path } }

    func remove(waiting: Bool = true) {
        removed.store(true, ordering: .releasing)
        answering.withLock { $0?.unlinkName() }
        // From inside didChange the gate is ours already; from elsewhere, taking it waits for a
        // call in progress (no call starts once the flag is set: it is checked under the gate).
        if waiting, thread.load(ordering: .acquiring) != UInt(pthread_self()) {
            gate.withLock { _ in }
        }
        mark(.end)
    }

    func run() {
        thread.store(UInt(pthread_self()), ordering: .releasing)
        // Room for many events; each is 16 bytes (watches on files carry no name).
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 8)
        defer { buffer.deallocate() }
        var events = EventState(fileWatch: fileWatch, markerWatch: markerWatch)
        var conversations = Conversations()
        defer { conversations.closeAll(listener: answering.withLock { $0?.listener }) }
        var knownPath = namedPath()
        var deletionReported = false
        while !removed.load(ordering: .acquiring), !events.watchEnded {
            if let answering = answering.withLock({ $0 }) {
                // Wait for inotify, the answering socket and the open conversations together.
                guard conversations.wait(inotify: inotify, listener: answering.listener) else { continue }
                conversations.serve(listener: answering.listener) { request in
                    gate.withLock { _ in removed.load(ordering: .acquiring) ? .gone : answer(request) }
                } reacquire: { reacquirer in
                    gate.withLock { _ in if !removed.load(ordering: .acquiring) { reacquirer() } }
                }
                var pending: CInt = 0
                guard ioctl(inotify, UInt(FIONREAD), &pending) == 0, pending > 0 else { continue }
            }
            guard let count = try? syscallRetryingInterrupts({ read(inotify, buffer.baseAddress, buffer.count) }) else { return }
            var changed = events.take(UnsafeRawBufferPointer(rebasing: buffer[..<count]))
            if events.moved {
                events.moved = false
                if let now = namedPath(), now != knownPath {
                    knownPath = now
                    follow(to: now, conversations: &conversations)
                    if let didMove = callbacks.didMove {
                        gate.withLock { _ in
                            if !removed.load(ordering: .acquiring) { didMove(now) }
                        }
                    }
                }
            }
            if events.attributesChanged {
                events.attributesChanged = false
                var status = stat()
                if let accommodateDeletion = callbacks.accommodateDeletion, !deletionReported, fstat(file.descriptor, &status) == 0, status.st_nlink == 0 {
                    deletionReported = true
                    gate.withLock { _ in
                        if !removed.load(ordering: .acquiring) { accommodateDeletion() }
                    }
                }
            }
            // A few rounds at most, so that a stream of writes cannot postpone the call forever.
            var rounds = 0
            while changed, rounds < 8, waitForWriters() {
                rounds += 1
                var pending: CInt = 0
                guard ioctl(inotify, UInt(FIONREAD), &pending) == 0, pending > 0,
                    let more = try? syscallRetryingInterrupts({ read(inotify, buffer.baseAddress, buffer.count) })
                else { break }
                changed = events.take(UnsafeRawBufferPointer(rebasing: buffer[..<more])) || changed
            }
            if changed, let didChange = callbacks.didChange {
                gate.withLock { _ in
                    if !removed.load(ordering: .acquiring) { didChange() }
                }
            }
        }
    }

    /// Runs the callback a coordinator asked for; called under the gate.
    private func answer(_ request: PresenterRequest) -> Conversations.Outcome {
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

    /// The file was renamed to `now` (presenter thread): the path follows, and the answering
    /// socket moves to the presenters directory beside the new name. Coordinators still
    /// connecting to the old socket are closed, as for a presenter gone from there. If the new
    /// directory cannot be used (it is another user's, or open to others), the presenter answers
    /// nobody from then on rather than trust it.
    private func follow(to now: String, conversations: inout Conversations) {
        currentPath.withLock { $0 = now }
        guard callbacks.answersCoordinators, !removed.load(ordering: .acquiring) else { return }
        let moved = try? AnsweringSocket(presenting: now)
        let old = answering.withLock { answering in
            defer { answering = moved }
            return answering
        }
        if let old {
            old.unlinkName()
            conversations.refuseWaiting(on: old.listener)
        }
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

/// The coordinators' conversations with one presenter, on the presenter's thread: each asks
/// one thing; a relinquish stays open until its access is over (the coordinator closes it, or
/// its process dies), and then the reacquirer runs.
private struct Conversations {
    enum Outcome {
        case done(FilePresenterCallbacks.Reacquirer?)
        case failed
        /// The presenter was removed: the conversation ends unanswered, as if it had died.
        case gone
    }

    private struct Conversation {
        let descriptor: FileDescriptor
        /// Set once the presenter relinquished: waiting for the end of the access.
        var relinquished = false
        var reacquirer: FilePresenterCallbacks.Reacquirer?
    }

    private var open: [Conversation] = []
    private var readable: [Bool] = []
    private var listenerReadable = false

    /// Waits until inotify, the listener or a conversation is readable; `false` if interrupted.
    mutating func wait(inotify: CInt, listener: FileDescriptor) -> Bool {
        // At the limit, new connections wait in the listener's backlog.
        let listening = open.count < PresenterDirectory.maximumConversations
        var polled = [pollfd(fd: inotify, events: Int16(POLLIN), revents: 0), pollfd(fd: listening ? listener.rawValue : -1, events: Int16(POLLIN), revents: 0)]
        polled += open.map { pollfd(fd: $0.descriptor.rawValue, events: Int16(POLLIN), revents: 0) }
        guard poll(&polled, nfds_t(polled.count), -1) > 0 else { return false }
        listenerReadable = polled[1].revents != 0
        readable = polled.dropFirst(2).map { $0.revents != 0 }
        return true
    }

    /// Accepts new conversations, reads the requests that came, answers them, and runs the
    /// reacquirers of accesses that are over.
    mutating func serve(listener: FileDescriptor, answer: (PresenterRequest) -> Outcome, reacquire: (FilePresenterCallbacks.Reacquirer) -> Void) {
        var still: [Conversation] = []
        for (conversation, isReadable) in zip(open, readable) {
            guard isReadable else {
                still.append(conversation)
                continue
            }
            let received = receiveByte(conversation.descriptor)
            if received == .notYet {
                still.append(conversation)
                continue
            }
            if conversation.relinquished {
                // The end of the access (a close, or a death), or bytes the protocol has none of.
                try? conversation.descriptor.close()
                conversation.reacquirer.map(reacquire)
                continue
            }
            guard case .byte(let byte) = received, let request = PresenterRequest(rawValue: byte) else {
                try? conversation.descriptor.close()
                continue
            }
            var reply: UInt8
            var next = conversation
            switch answer(request) {
            case .done(let reacquirer):
                reply = PresenterAnswer.done.rawValue
                next.relinquished = request != .save
                next.reacquirer = reacquirer
            case .failed:
                reply = PresenterAnswer.failed.rawValue
            case .gone:
                try? conversation.descriptor.close()
                continue
            }
            if send(conversation.descriptor.rawValue, &reply, 1, CInt(MSG_NOSIGNAL | MSG_DONTWAIT)) == 1, next.relinquished {
                still.append(next)
            } else {
                try? conversation.descriptor.close()
                // A coordinator gone before the answer: its access is over already.
                if next.relinquished { next.reacquirer.map(reacquire) }
            }
        }
        open = still
        readable = []
        guard listenerReadable else { return }
        listenerReadable = false
        while open.count < PresenterDirectory.maximumConversations, case .accepted(let descriptor) = (try? UnixSocket.acceptIfReady(listener)) ?? .none {
            guard let peer = try? UnixSocket.peerCredentials(descriptor), peer.uid == geteuid() else {
                try? descriptor.close()
                continue
            }
            open.append(Conversation(descriptor: descriptor))
        }
    }

    /// Closes the connections waiting in `listener`'s backlog unanswered (a listener the
    /// presenter leaves); the open conversations go on.
    mutating func refuseWaiting(on listener: FileDescriptor) {
        listenerReadable = false
        while case .accepted(let descriptor) = (try? UnixSocket.acceptIfReady(listener)) ?? .none {
            try? descriptor.close()
        }
    }

    /// Ends every conversation without answering or reacquiring (the presenter is removed),
    /// also those still waiting to be accepted: their coordinators see the end at once, as for
    /// a presenter that died, instead of waiting for their timeouts.
    mutating func closeAll(listener: FileDescriptor?) {
        open.forEach { try? $0.descriptor.close() }
        open = []
        guard let listener else { return }
        while case .accepted(let descriptor) = (try? UnixSocket.acceptIfReady(listener)) ?? .none {
            try? descriptor.close()
        }
    }
}

/// Reads inotify events in order, telling the presenter's own writes (between a begin and an end
/// marker) from everyone else's.
private struct EventState {
    let fileWatch: CInt
    let markerWatch: CInt
    var insideOwnWrite = false
    var watchEnded = false
    /// The file was renamed (IN_MOVE_SELF) since the caller last looked.
    var moved = false
    /// The file's attributes, its link count among them, changed (IN_ATTRIB).
    var attributesChanged = false

    /// Takes a batch of events; returns whether it holds a change to report.
    mutating func take(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var changed = false
        var offset = 0
        while offset + 16 <= bytes.count {
            let watch = bytes.loadUnaligned(fromByteOffset: offset, as: Int32.self)
            let mask = bytes.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
            offset += 16 + Int(bytes.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
            if mask & UInt32(IN_Q_OVERFLOW) != 0 {
                // Events were lost, markers perhaps among them.
                changed = true
                insideOwnWrite = false
            } else if watch == markerWatch {
                insideOwnWrite = mask & UInt32(IN_ACCESS) != 0
            } else if watch == fileWatch {
                if mask & UInt32(IN_MODIFY) != 0, !insideOwnWrite { changed = true }
                if mask & UInt32(IN_IGNORED) != 0 { watchEnded = true }
                if mask & UInt32(IN_MOVE_SELF) != 0 { moved = true }
                if mask & UInt32(IN_ATTRIB) != 0 { attributesChanged = true }
            }
        }
        return changed
    }
}
