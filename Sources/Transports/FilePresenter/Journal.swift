import CIPCShims
import Glibc
import IPCCore
import IPCFileCoordination
import IPCEngine
import IPCFraming
import IPCSystem
import Synchronization
import SystemPackage

/// Journals: files of records that writers append under coordinated writes and one reader
/// consumes from the offset it last read. See ``JournalHeader`` for the guarantees.
enum Journal {
    /// Creates a journal at `path` that this process reads, replacing any file there, and opens it.
    /// The file is written unnamed and then linked into place, so nobody sees it without its header.
    /// - Throws: ``IPCError/Code/transportFailure``.
    static func create(at path: String, in group: GroupDirectory, capacity: Int) throws -> JournalFile {
        let descriptor = ipc_open_unnamed_file(group.path)
        guard descriptor >= 0 else { throw IPCError.syscall("open(O_TMPFILE)", Errno(rawValue: errno), context: group.path) }
        let file = CoordinatedFile(descriptor: descriptor, path: path)
        try FileCoordinator.journal().coordinate(writingItem: file, timeout: .seconds(1)) { access in
            try access.write(JournalHeader(ownerPID: getpid(), capacity: capacity).bytes, at: 0)
            // As long as compaction keeps it (sparse: no blocks until written), so that writers
            // can append through their mapping of it (``JournalFile/writeMapped(_:_:at:)``).
            try access.truncate(to: JournalFile.mappedLength(capacity: capacity))
        }
        _ = unlink(path)
        guard linkat(AT_FDCWD, "/proc/self/fd/\(descriptor)", AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0 else {
            throw IPCError.syscall("linkat", Errno(rawValue: errno), context: path)
        }
        return try JournalFile(file, timeout: .seconds(1))
    }

    static func readHeader(_ access: FileAccess) throws -> JournalHeader {
        try withUnsafeTemporaryAllocation(byteCount: JournalHeader.length, alignment: 8) { buffer in
            let count = try access.read(into: buffer, at: 0)
            return try JournalHeader(parsing: UnsafeRawBufferPointer(rebasing: buffer[..<count]))
        }
    }
}

/// An open journal: the file, and its header and first records mapped into memory.
///
/// The committed end is read and moved through the mapping, holding the file's lock. That takes
/// no system call and makes no inotify event. A writer also copies a record that fits the mapped
/// window into it (``writeMapped(_:_:at:)``), which makes no event either, and after unlocking
/// rings the reader (``ringReader()``): the reader is woken once per record, with the lock
/// already free. A record written with a system call instead wakes the reader with the write,
/// before the commit, and the reader then waits for the lock (WIRE-FORMAT.md, section 7).
final class JournalFile: @unchecked Sendable {
    // @unchecked: the mapped header and records are read and written only while holding the
    // file's lock; `mappedWritesFailed` and `knownFileLength` are atomics.
    let file: CoordinatedFile
    /// The header as it was when the journal was opened (its owner and capacity do not change).
    let header: JournalHeader
    private let mapping: UnsafeMutableRawPointer
    private let mappedLength: Int
    /// A copy into the mapping faulted once (the file is shorter than the window: its reader
    /// does not keep it that long, or someone cut it): records are written with pwrite from then on.
    private let mappedWritesFailed = Atomic<Bool>(false)
    /// The file's length when last looked at. A journal's reader keeps it at least
    /// ``mappedLength(capacity:)`` long once it is (WIRE-FORMAT.md, section 7), so it is looked
    /// at again only while it is shorter than a record's end: a copy past the file's end in its
    /// last page would not fault, and would be lost.
    private let knownFileLength = Atomic<Int>(0)

    /// How much of a journal is mapped: its header and the records before the compaction
    /// threshold, which is as long as its reader keeps the file (WIRE-FORMAT.md, section 7).
    static func mappedLength(capacity: Int) -> Int {
        JournalHeader.length + JournalHeader.compactionThreshold(capacity: capacity)
    }

    /// - Throws: ``IPCError/Code/malformedFrame`` if the file is not a journal;
    ///   ``IPCError/Code/coordinationTimeout``; ``IPCError/Code/transportFailure``.
    init(_ file: CoordinatedFile, timeout: Duration) throws {
        header = try FileCoordinator.journal().coordinate(readingItem: file, timeout: timeout, byAccessor: Journal.readHeader)
        let length = Self.mappedLength(capacity: header.capacity)
        let address = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, file.descriptor, 0)
        guard let address, address != UnsafeMutableRawPointer(bitPattern: -1) else {
            throw IPCError.syscall("mmap", Errno(rawValue: errno), context: file.path)
        }
        self.file = file
        mapping = address
        mappedLength = length
    }

    deinit {
        munmap(mapping, mappedLength)
    }

    /// Copies a record (`head`, then `payload`) to `offset` through the mapping, holding the
    /// file's exclusive lock.
    /// - Returns: whether it did: `false` (having changed nothing a reader may read, which is
    ///   all at or past the committed end) if the record does not fit the window, the file ends
    ///   before the record would, or a copy faulted before (someone cut the file shorter than
    ///   its reader keeps it); write it with a system call then.
    func writeMapped(_ head: [UInt8], _ payload: [UInt8]?, at offset: Int) -> Bool {
        let length = head.count + (payload?.count ?? 0)
        guard offset >= JournalHeader.length, length <= mappedLength - offset, !mappedWritesFailed.load(ordering: .relaxed) else { return false }
        if offset + length > knownFileLength.load(ordering: .relaxed) {
            var status = stat()
            guard fstat(file.descriptor, &status) == 0 else { return false }
            knownFileLength.store(Int(status.st_size), ordering: .relaxed)
            guard offset + length <= Int(status.st_size) else { return false }
        }
        var copied = head.withUnsafeBytes { ipc_guarded_copy(mapping + offset, $0.baseAddress!, $0.count) == 0 }
        if copied, let payload, !payload.isEmpty {
            copied = payload.withUnsafeBytes { ipc_guarded_copy(mapping + offset + head.count, $0.baseAddress!, $0.count) == 0 }
        }
        if !copied { mappedWritesFailed.store(true, ordering: .relaxed) }
        return copied
    }

    /// Wakes the journal's reader after a record written with ``writeMapped(_:_:at:)`` was
    /// committed and the lock released: one byte of the header that is always zero, written
    /// again (its write makes the `IN_MODIFY` the reader waits for).
    /// - Returns: `nil`, or why the byte could not be written (the record is committed, and the
    ///   reader reads it when it next wakes).
    func ringReader() -> IPCError? {
        var zero: UInt8 = 0
        do {
            _ = try syscallRetryingInterrupts { pwrite(file.descriptor, &zero, 1, off_t(JournalHeader.wakeOffset)) }
            return nil
        } catch {
            return IPCError.syscall("pwrite", error, context: file.path)
        }
    }

    private var committedEndField: UnsafeMutablePointer<UInt64> {
        (mapping + JournalHeader.committedEndOffset).assumingMemoryBound(to: UInt64.self)
    }

    /// The committed end. Read it holding the file's lock.
    /// - Throws: ``IPCError/Code/malformedFrame`` if it is before the first record or further
    ///   than writers that follow the rules can put it (``JournalHeader/maximumCommittedEnd``).
    func committedEnd() throws -> Int {
        var stored: UInt64 = 0
        guard ipc_guarded_load_u64(committedEndField, &stored) == 0 else { throw Self.truncated(file.path) }
        let end = UInt64(bigEndian: stored)
        guard end >= UInt64(JournalHeader.length), end <= UInt64(header.maximumCommittedEnd) else {
            throw IPCError(code: .malformedFrame, message: "\(file.path) has committed end \(end)")
        }
        return Int(end)
    }

    /// Moves the committed end. Call it holding the file's exclusive lock.
    /// - Throws: ``IPCError/Code/truncatedFrame`` if the file was truncated under its mapping.
    func commit(_ end: Int) throws {
        guard ipc_guarded_store_u64(committedEndField, UInt64(end).bigEndian) == 0 else { throw Self.truncated(file.path) }
    }

    /// A journal cut shorter than its header by someone else: the mapped header is gone (its
    /// access faulted, and the fault was caught instead of ending the process).
    private static func truncated(_ path: String) -> IPCError {
        IPCError(code: .truncatedFrame, message: "\(path) was truncated under its mapped header")
    }
}

/// Appends records to someone else's journal.
struct JournalAppender: Sendable {
    let journal: JournalFile
    /// Payloads up to this size are copied behind their headers and written in one call.
    private static let gatherLimit = 16 * 1024
    /// Records whose payload is up to this size are copied through the journal's mapping, when
    /// they fit it (``JournalFile/writeMapped(_:_:at:)``); larger ones are written with system
    /// calls. `floor:journal` draws the line at the same payload size.
    static let mappedPayloadLimit = 64 * 1024

    init(_ journal: JournalFile) {
        self.journal = journal
    }

    /// A record ready to append: its header (and the frame's, and a small payload) in one
    /// buffer, and a large payload apart.
    struct Prepared: Sendable {
        fileprivate let head: [UInt8]
        fileprivate let payload: [UInt8]?
        var length: Int { head.count + (payload?.count ?? 0) }
        /// Whether it goes through the journal's mapping, if it fits there.
        fileprivate let mappable: Bool
    }

    /// Why ``tryAppend(_:)`` did not append.
    enum Obstacle {
        /// Another writer, or the reader, holds the file's lock.
        case locked
        /// The journal is at its capacity: its reader has not read (and compacted) yet.
        case full
    }

    /// Encodes `record` (and `frame`) for appending.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` for a payload no record can carry.
    func prepare(_ record: RecordHeader, frame: Frame? = nil) throws -> Prepared {
        var head = record.bytes
        guard let frame else { return Prepared(head: head, payload: nil, mappable: true) }
        try BinaryFrameEncoder(maximumPayloadLength: Int(UInt32.max)).encodeHeader(FrameHeader(frame), into: &head)
        let mappable = frame.payload.count <= Self.mappedPayloadLimit
        if frame.payload.count <= Self.gatherLimit {
            head += frame.payload
            return Prepared(head: head, payload: nil, mappable: mappable)
        }
        return Prepared(head: head, payload: frame.payload, mappable: mappable)
    }

    /// Appends one record, waiting for the file's lock and for room in the journal.
    /// - Parameter cancelled: asked between waits; once it is true the append gives up.
    /// - Throws: ``IPCError/Code/sendTimeout`` if neither came within `timeout`;
    ///   `CancellationError` once `cancelled()` is true; ``IPCError/Code/malformedFrame`` if
    ///   the file is not a journal; ``IPCError/Code/transportFailure``.
    func append(_ record: RecordHeader, frame: Frame? = nil, timeout: Duration, cancelled: () -> Bool = { false }) throws {
        try append(prepare(record, frame: frame), timeout: timeout, cancelled: cancelled, unrung: { _ in })
    }

    /// ``append(_:frame:timeout:cancelled:)`` of a prepared record.
    /// - Parameter unrung: called, after the record was committed, if the reader could not be
    ///   woken for it (``JournalFile/ringReader()``): the caller ends its connection, whose end
    ///   the peer sees on the rendezvous socket, and then reads what was committed.
    func append(_ prepared: Prepared, timeout: Duration, cancelled: () -> Bool = { false }, unrung: (IPCError) -> Void) throws {
        let giveUp = deadline(after: timeout)
        var backoff = Backoff()
        while true {
            if cancelled() { throw CancellationError() }
            // The lock is waited for in slices, so that a cancellation is seen within one.
            let obstacle = try attempt(prepared, lockTimeout: min(remaining(until: giveUp), .milliseconds(20)), unrung: unrung)
            guard let obstacle else { return }
            guard monotonicNanoseconds() < giveUp else {
                switch obstacle {
                case .locked:
                    throw IPCError(code: .sendTimeout, message: "the journal \(journal.file.path) stayed locked for \(timeout)")
                case .full:
                    throw IPCError(code: .sendTimeout, message: "the journal \(journal.file.path) stayed full for \(timeout): its reader is not reading")
                }
            }
            if obstacle == .full { backoff.wait() }
        }
    }

    /// Appends `prepared` if the lock is free and the journal has room now; never waits.
    /// - Returns: `nil` once appended, else what is in the way.
    /// - Throws: as ``append(_:timeout:cancelled:)`` does, but never `sendTimeout`.
    func tryAppend(_ prepared: Prepared, unrung: (IPCError) -> Void) throws -> Obstacle? {
        try attempt(prepared, lockTimeout: .zero, unrung: unrung)
    }

    /// One append under the file's exclusive lock, which is waited for up to `lockTimeout`
    /// (not at all for zero: a busy lock then costs one try, with no error made). The journal's
    /// reader asks no presenter, so the lock is all a coordinated write of it takes.
    private func attempt(_ prepared: Prepared, lockTimeout: Duration, unrung: (IPCError) -> Void) throws -> Obstacle? {
        let file = journal.file
        if lockTimeout == .zero {
            guard try file.tryLock(exclusive: true) else { return .locked }
        } else {
            do {
                try file.lock(exclusive: true, timeout: lockTimeout)
            } catch let error as IPCError where error.code == .coordinationTimeout {
                return .locked
            }
        }
        var mapped = false
        do {
            defer { file.unlock() }
            let access = FileAccess(file: file, isWriting: true)
            let end = try journal.committedEnd()
            guard journal.header.admits(prepared.length, committedEnd: end) else { return .full }
            mapped = prepared.mappable && journal.writeMapped(prepared.head, prepared.payload, at: end)
            if !mapped {
                try access.write(prepared.head, at: end)
                if let payload = prepared.payload {
                    try access.write(payload, at: end + prepared.head.count)
                }
            }
            try journal.commit(end + prepared.length)
        }
        // After the unlock, so that the reader does not wake to wait for this writer.
        if mapped, let error = journal.ringReader() { unrung(error) }
        return nil
    }
}

/// Reads this process's own journal from the last consumed offset, and compacts it.
/// Used on the event loop's thread only (a client's channel, or the listener, reads with it).
final class JournalReader: @unchecked Sendable {
    // @unchecked: used on the loop's thread only.
    let journal: JournalFile
    private let maximumPayloadLength: Int
    private let capacity: Int
    private var consumed = JournalHeader.length
    private var buffer: [UInt8] = []
    /// Records read from the file and not handled yet, because a handler asked to stop (the
    /// application's buffer was full): the bytes of `buffer` in this range, handled first next time.
    private var pending: Range<Int> = 0..<0
    /// A compaction was due and skipped because a writer held the lock. It is tried again at
    /// the next ``fill()``, even one that finds nothing new: a writer waiting for the room it
    /// makes writes nothing meanwhile, so no change of the file would bring that fill, and the
    /// reader's owner must call it from a timer (``FilePresenterChannel``).
    private(set) var compactionOwed = false

    init(_ journal: JournalFile, maximumPayloadLength: Int) {
        self.journal = journal
        self.capacity = journal.header.capacity
        self.maximumPayloadLength = maximumPayloadLength
    }

    private var file: CoordinatedFile { journal.file }

    private var coordinator: FileCoordinator { .journal() }

    /// For a reader on the event loop, record by record: reads what was committed since the
    /// last read, with one try of the lock, for ``next(lend:)`` to hand out. Records read and
    /// not yet handed out are handed out first: nothing new is read until they are.
    /// - Returns: `nil` if a writer holds the lock (try again later); else the bytes of records
    ///   waiting to be handed out (0: none).
    /// - Throws: ``IPCError/Code/malformedFrame``, ``IPCError/Code/truncatedFrame`` or
    ///   ``IPCError/Code/frameTooLarge`` if the journal cannot be read on;
    ///   ``IPCError/Code/transportFailure``.
    func fill() throws -> Int? {
        if !pending.isEmpty { return pending.count }
        guard let available = try readOnce() else { return nil }
        pending = 0..<available
        // The records are in memory already: the file's may be compacted.
        if available > 0 || compactionOwed { try compactIfDue() }
        return available
    }

    /// The next record ``fill()`` read, or `nil` once all are handed out. `lend` is offered
    /// each one-way message in place (``JournalRecord/decode(_:maximumPayloadLength:offering:_:)``).
    /// - Throws: ``IPCError/Code/malformedFrame`` or ``IPCError/Code/truncatedFrame``.
    func next(offering: Bool, lend: (RecordHeader, FrameHeader, UnsafeRawBufferPointer) -> JournalLending) throws -> JournalRecord? {
        guard !pending.isEmpty else {
            trimBuffer()
            return nil
        }
        let (record, length) = try buffer.withUnsafeBytes { bytes in
            try JournalRecord.decode(UnsafeRawBufferPointer(rebasing: bytes[pending]), maximumPayloadLength: maximumPayloadLength, offering: offering, lend)
        }
        pending = (pending.lowerBound + length)..<pending.upperBound
        return record
    }

    /// Lets a buffer grown for a burst go, once nothing in it waits.
    private func trimBuffer() {
        if buffer.count > 4 * JournalHeader.compactionThreshold(capacity: capacity) { buffer = [] }
    }

    /// One try of the lock: the bytes read, `nil` if a writer holds it.
    private func readOnce() throws -> Int? {
        guard let count = try coordinator.tryCoordinate(file, exclusive: false, byAccessor: readLocked) else { return nil }
        consumed += count
        return count
    }

    /// Committed bytes read without first checking that the file holds them.
    static let readWithoutSizeCheck = 1 << 16

    /// Under the lock: reads what was committed since ``consumed`` into ``buffer``.
    private func readLocked(_ access: FileAccess) throws -> Int {
        let end = try journal.committedEnd()
        guard end >= consumed else {
            throw IPCError(code: .malformedFrame, message: "the committed end of \(file.path) moved back from \(consumed) to \(end)")
        }
        let count = end - consumed
        // Bounded by the capacity writers respect, plus one record allowed past it.
        guard count <= capacity + maximumPayloadLength + 64 else {
            throw IPCError(code: .frameTooLarge, message: "\(count) committed bytes in \(file.path) are more than its capacity and one frame")
        }
        // Before a large buffer is allocated for them: a committed end is only a number in a
        // file its writer (another process) can set to anything. (A small read finds the file
        // short by reading, as below, and costs no `fstat` on the round trip's path.)
        guard try count <= Self.readWithoutSizeCheck || end <= access.size() else {
            throw IPCError(code: .truncatedFrame, message: "\(file.path) ends before its committed end \(end)")
        }
        if buffer.count < count { buffer = [UInt8](repeating: 0, count: count) }
        let got = try buffer.withUnsafeMutableBytes { try access.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[..<count]), at: consumed) }
        guard got == count else {
            throw IPCError(code: .truncatedFrame, message: "\(file.path) ends before its committed end")
        }
        return count
    }

    /// Once the consumed records reach the threshold, moves the unread ones (if they are no more
    /// than the consumed ones, so the copying stays proportional to what was read) to the start,
    /// and shortens the file. Skipped, to be tried at the next ``fill()`` (``compactionOwed``),
    /// if a writer holds the lock.
    private func compactIfDue() throws {
        let threshold = JournalHeader.compactionThreshold(capacity: capacity)
        let consumedBytes = consumed - JournalHeader.length
        guard consumedBytes >= threshold else {
            compactionOwed = false
            return
        }
        func compact(_ access: FileAccess) throws {
            let unread = try journal.committedEnd() - consumed
            guard unread >= 0 else {
                throw IPCError(code: .malformedFrame, message: "the committed end of \(file.path) moved back before \(consumed)")
            }
            guard unread <= consumedBytes else { return }
            if unread > 0 {
                try access.write(try access.read(at: consumed, count: unread), at: JournalHeader.length)
            }
            try journal.commit(JournalHeader.length + unread)
            let keep = JournalHeader.length + max(unread, threshold)
            if try access.size() > keep { try access.truncate(to: keep) }
            consumed = JournalHeader.length
        }
        // Skipped, to be tried at the next fill, if a writer holds the lock now.
        compactionOwed = try coordinator.tryCoordinate(file, exclusive: true, byAccessor: compact) == nil
    }
}
