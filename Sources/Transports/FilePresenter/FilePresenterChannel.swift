import CIPCShims
import Dispatch
import Glibc
import IPCCore
import IPCFileCoordination
public import IPCEngine
import IPCFraming
import IPCSystem
import Synchronization
import SystemPackage

/// One side of a file presenter conversation: an ``EngineConnection`` over a
/// ``FilePresenterChannel``, as every transport's connection is.
///
/// Each side reads one journal on the process's event loop — a client its journal, the listener
/// the client's outbox — and appends to the other: an inotify watch on the file it reads
/// (``JournalWatch``) tells the channel, which asks the engine to read (``ChannelInbound/pulled``);
/// a read that finds the journal locked tries again from a loop timer, so no thread is kept per
/// connection and the loop never waits for a lock. No file is shared between clients, so a
/// client that stalls while holding its outbox's lock holds up its own connection only.
/// Sends append to the peer's journal on the calling thread when it is free and has room;
/// otherwise the engine keeps the frame and tries again from a loop timer
/// (``ChannelWriteWait/retried``): an `async` send suspends meanwhile, a synchronous one waits
/// for the loop's word, and a send from the loop's thread returns at once.
///
/// The other side's end is seen on the rendezvous socket the connection was set up over, which
/// both keep open: its end of file comes as soon as the peer's process closes its descriptors
/// (a killed process does that before it has finished exiting). Before acting on it, this side
/// reads what the peer appended, so a goodbye or a message written just before is not lost. The
/// peer's process is watched too (a pidfd), for a peer whose socket outlives it in a forked child.
public typealias FilePresenterConnection = EngineConnection

/// What the engine needs of one file presenter conversation: records in (read from the
/// client's journal, or on the listener from the client's outbox), records out (appended to the
/// other one), the rendezvous socket watched for the peer's end, and the goodbye and the files
/// tidied at the end.
///
/// A frame's encoding is one record: the 12-byte record header, the 20-byte frame header and
/// the payload, appended whole or not at all.
final class FilePresenterChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: the reading state (`reader`, `peerGone`, `goodbye`, `violation`, `retry`) is
    // touched on the loop's thread only; `connection` is a Mutex;
    // `endReason` is set on the loop's thread before the engine's lock that orders it before
    // ``close()``; `outbound` is used by one writer at a time and let go of by ``close()``,
    // after which the engine writes nothing; the rest is immutable.

    enum Role {
        /// The client: it reads its own journal and appends to its own outbox, and removes both
        /// when it ends.
        case client(journalPath: String, outboxPath: String)
        /// The listener's view of one client: it reads the client's outbox and appends to the
        /// client's journal; both are removed here if the client died.
        case server(clientJournalPath: String, clientOutboxPath: String)
    }

    /// The rendezvous socket, kept open for the connection's life: the loop watches it for the
    /// peer's end (``watchesDescriptorForEnd``).
    let descriptor: FileDescriptor
    var inbound: ChannelInbound { .pulled }
    var watchesDescriptorForEnd: Bool { true }
    var writeWait: ChannelWriteWait { .retried }

    let role: Role
    /// The peer's journal; let go of (closing it) when the channel closes.
    private var outbound: JournalAppender?
    /// The id this side puts in its records: the client's own, or the listener's (serial 0).
    private let sender: SenderID
    private let peerPID: Int32
    private let maximumPayloadLength: Int
    private let loop: EventLoop
    /// The connection this channel serves, for what the channel starts itself (a read after
    /// the journal changed, a retry, the end of a drain, an invalidation); set once it exists,
    /// and let go of when the channel closes.
    private let connection = Mutex<EngineConnection?>(nil)
    /// The watch on the file this side reads, stopped when the channel closes.
    private let watch = Mutex<JournalWatch?>(nil)

    /// The reader of this side's journal (the client's journal, or on the listener the client's
    /// outbox); loop thread.
    private var reader: JournalReader?
    /// The rendezvous socket reported its end.
    private var peerGone = false
    /// A goodbye record arrived.
    private var goodbye = false
    /// The peer wrote to the rendezvous socket after the handshake.
    private var violation = false
    /// The next try of a read that found its journal locked, and whether it is armed.
    private var retry = JournalRetry()
    private var retryArmed = false
    private var endReason: InvalidationReason?

    /// - Parameters:
    ///   - lifeline: the rendezvous socket (owned: closed by ``close()``).
    ///   - outbound: the peer's journal, which this side appends to.
    ///   - reader: the reader of the file this side reads (the client's journal, or its outbox).
    init(
        role: Role, lifeline: FileDescriptor, outbound: JournalAppender, sender: SenderID, peerPID: Int32, reader: JournalReader, maximumPayloadLength: Int, loop: EventLoop
    ) {
        self.role = role
        self.descriptor = lifeline
        self.outbound = outbound
        self.sender = sender
        self.peerPID = peerPID
        self.reader = reader
        self.maximumPayloadLength = maximumPayloadLength
        self.loop = loop
    }

    /// Connects the channel to its connection, once the connection exists.
    func attach(_ connection: EngineConnection) {
        self.connection.withLock { $0 = connection }
    }

    private var attached: EngineConnection? { connection.withLock { $0 } }

    /// Keeps the watch on the file this side reads, stopped when the channel closes.
    func keep(_ journalWatch: JournalWatch) {
        watch.withLock { $0 = journalWatch }
    }

    /// The file this side reads changed (loop thread, from its ``JournalWatch``): read it.
    func journalChanged() {
        attached?.readNow()
    }

    // MARK: Reading (loop thread)

    func descriptorReported() {
        var bytes = (UInt64(0), UInt64(0))
        let count = withUnsafeMutableBytes(of: &bytes) { recv(descriptor.rawValue, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) }
        if count < 0 { return }
        if count > 0 {
            violation = true
            return
        }
        // What the peer appended before it went is read first (``readAvailable()``): a goodbye
        // ends the connection as peerClosed, and messages before it are delivered.
        peerGone = true
    }

    func readAvailable() throws -> Int? {
        if violation {
            throw IPCError(code: .malformedFrame, message: "the peer wrote to the rendezvous socket after the handshake")
        }
        if goodbye { return 0 }
        guard let reader else { return nil }
        guard let count = try reader.fill() else {
            retryLater()
            return nil
        }
        // A compaction a writer's lock held off: the writer may wait for the room it makes and
        // write nothing meanwhile, so no change of the file would bring the next try (a stream
        // stalled until its sender's timeout about one run in ten). Tried again from the timer,
        // backing off as for a locked read.
        if reader.compactionOwed { retryLater() } else { retry.reset() }
        if count > 0 {
            // The end, if it came, is reported after these records: read again for it.
            if peerGone { loop.execute { [weak self] in self?.attached?.readNow() } }
            return count
        }
        return peerGone ? 0 : nil
    }

    /// The journal this side reads was locked: read again from a loop timer (one armed at a time),
    /// sooner the first times.
    private func retryLater() {
        guard !retryArmed else { return }
        retryArmed = true
        loop.schedule(at: monotonicNanoseconds() &+ retry.next(), retryAction)
    }

    /// The retry timer's action, made once: a closure made per retry would be an allocation.
    private lazy var retryAction: @Sendable () -> Void = { [weak self] in
        guard let self else { return }
        retryArmed = false
        attached?.readNow()
    }

    func nextFrame() throws -> Frame? {
        switch try nextRecord(offering: false, lend: { _, _ in false }) {
        case .lent, nil: return nil
        case .owned(let frame): return frame
        }
    }

    /// A one-way message is lent in place, from the reader's buffer: no copy and no allocation
    /// if the handler takes it.
    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        try nextRecord(offering: true, lend: lend)
    }

    private func nextRecord(offering: Bool, lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        guard let reader, !goodbye else { return nil }
        while let record = try reader.next(offering: offering, lend: { _, header, payload in lend(header, payload) ? .taken : .declined }) {
            switch record {
            case .lent:
                return .lent
            case .frame(_, let frame, _):
                return .owned(frame)
            case .oversized(_, let error):
                throw error
            case .control(let header):
                guard header.kind == .goodbye else { continue }  // Version 1's handshake records: skipped.
                goodbye = true
                // Reported by the next read.
                loop.execute { [weak self] in self?.attached?.readNow() }
                return nil
            }
        }
        return nil
    }

    var hasPartialFrame: Bool { false }

    func finishReading() throws {
        guard !goodbye else { return }
        throw IPCError(code: .peerInvalidated, message: "process \(peerPID) closed the rendezvous socket without a goodbye: it exited")
    }

    // MARK: Writing (one writer at a time)

    func encodedLength(of frame: Frame) throws -> Int {
        guard frame.payload.count <= Int(UInt32.max) else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above what a record can carry")
        }
        return RecordHeader.length + BinaryWireFormat.headerLength + frame.payload.count
    }

    /// Appends the frame's record if the peer's journal is free and has room now; else takes
    /// nothing, and the engine tries again from a timer.
    func write(_ frame: Frame, from offset: Int) throws -> Int {
        guard let outbound else { throw IPCError(code: .invalidated, message: "the connection is closed") }
        let record = try outbound.prepare(RecordHeader(kind: .frame, sender: sender), frame: frame)
        guard try outbound.tryAppend(record, unrung: readerUnreachable) == nil else { return 0 }
        return record.length
    }

    /// A record was committed but its reader could not be woken for it: the connection ends,
    /// and the peer, seeing that end on the rendezvous socket, reads what was committed first.
    private func readerUnreachable(_ error: IPCError) {
        attached?.invalidate(InvalidationReason(.transportFailure, error: error))
    }

    // MARK: Ending

    func shutdown() {
        // Nobody waits on the socket or the journals (the engine's senders wait for its word).
    }

    func ending(_ reason: InvalidationReason) {
        endReason = reason
    }

    func close() {
        connection.withLock { $0 = nil }
        reader = nil
        watch.withLock { $0.take() }?.cancel()
        // Whatever ended this side, unless the other side did, tell it (a client whose
        // connection the listener ended, for an unreadable outbox say, would otherwise wait for
        // replies that never come). The rest comes after the goodbye, so that a peer woken by
        // the end of file finds it.
        let peerEnded = [.peerClosed, .peerDied].contains(endReason?.kind)
        guard let outbound = outbound.take() else { return release() }
        guard !peerEnded, let goodbye = try? outbound.prepare(RecordHeader(kind: .goodbye, sender: sender)) else { return release() }
        if (try? outbound.tryAppend(goodbye, unrung: { _ in })) != .some(nil) {
            // Busy or full: waited for a little, off the loop's thread.
            DispatchQueue.global().async { [self] in
                try? outbound.append(goodbye, timeout: .milliseconds(100), unrung: { _ in })
                release()
            }
            return
        }
        release()
    }

    /// Closes the socket and removes the files this side is responsible for.
    private func release() {
        try? descriptor.close()
        switch role {
        case .client(let journalPath, let outboxPath):
            _ = unlink(journalPath)
            _ = unlink(outboxPath)
        case .server(let clientJournalPath, let clientOutboxPath):
            // A dead client cannot remove its own files.
            if endReason?.kind == .peerDied {
                _ = unlink(clientJournalPath)
                _ = unlink(clientOutboxPath)
            }
        }
    }
}

extension EngineConnection {
    /// A file-presenter client's own journal; `nil` for other connections.
    var journalPath: String? {
        guard let channel = channel as? FilePresenterChannel, case .client(let path, _) = channel.role else { return nil }
        return path
    }

    /// A file-presenter client's own outbox, which the listener reads; `nil` for other connections.
    var outboxPath: String? {
        guard let channel = channel as? FilePresenterChannel, case .client(_, let path) = channel.role else { return nil }
        return path
    }
}
