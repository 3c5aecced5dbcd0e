import IPCCore
import IPCFileCoordination
import IPCFraming

/// The header at the start of every journal file. Specified in `docs/WIRE-FORMAT.md`, section 5.
///
///     offset size field
///     0      4    magic 0x49 0x50 0x46 0x4A ("IPFJ")
///     4      1    version, 3 (1 said hello in a shared inbox; 2 on the rendezvous socket;
///                 3: each client writes its own outbox instead of a shared inbox)
///     5      3    zero
///     8      4    pid of the journal's creator (its owner: the client, for a client's
///                 journal and outbox), big-endian
///     12     4    capacity in bytes, big-endian
///     16     8    committed end: the offset just past the last whole record, big-endian
///     24          the first record
///
/// Only bytes before the committed end mean anything. A writer appends a record at the
/// committed end and then moves the committed end past it, holding the file's exclusive lock;
/// a writer killed in between leaves the committed end where it was, so its partial record is
/// never read, and the next writer writes over it. The record is written with `pwrite`, which
/// makes the inotify event that wakes the reader; the committed end is moved through a shared
/// mapping of the header, which makes none, so that each record wakes the reader once.
///
/// The reader compacts the journal once it has consumed the compaction threshold (half the
/// capacity, at most 1 MiB): it moves the records it has not read yet to the start and sets the
/// committed end after them. A writer waits while the records take more than the capacity,
/// unless they take at most the threshold (so one record larger than the capacity still goes in).
struct JournalHeader: Equatable {
    static let length = 24
    static let committedEndOffset = 16
    /// The header byte a writer writes (always zero) to wake the reader (WIRE-FORMAT.md, section 7).
    static let wakeOffset = 7
    static let magic: [UInt8] = [0x49, 0x50, 0x46, 0x4A]
    static let version: UInt8 = 3

    var ownerPID: Int32
    var capacity: Int
    var committedEnd: Int

    init(ownerPID: Int32, capacity: Int, committedEnd: Int = JournalHeader.length) {
        self.ownerPID = ownerPID
        self.capacity = capacity
        self.committedEnd = committedEnd
    }

    static func compactionThreshold(capacity: Int) -> Int {
        min(1 << 20, capacity / 2)
    }

    /// The longest record: its header, a binary frame header and the largest payload the
    /// frame header can announce.
    static let maximumRecordLength = RecordHeader.length + BinaryWireFormat.headerLength + Int(UInt32.max)

    /// The furthest a committed end can lie when every writer follows ``admits(_:committedEnd:)``:
    /// records fill the capacity, or one record of any length starts within the threshold.
    /// A larger one was written by someone who does not (a forged header).
    var maximumCommittedEnd: Int {
        Self.length + max(capacity, Self.compactionThreshold(capacity: capacity) + Self.maximumRecordLength)
    }

    /// Whether a writer may append a record of `length` bytes to a journal of this capacity
    /// whose records end at `committedEnd` (at least ``length``; the arithmetic cannot overflow
    /// whatever the file says).
    func admits(_ length: Int, committedEnd end: Int) -> Bool {
        let recordBytes = end - Self.length
        return recordBytes <= Self.compactionThreshold(capacity: capacity) || (recordBytes <= capacity && length <= capacity - recordBytes)
    }

    var bytes: [UInt8] {
        var bytes = Self.magic + [Self.version, 0, 0, 0]
        bytes += withUnsafeBytes(of: UInt32(bitPattern: ownerPID).bigEndian, Array.init)
        bytes += withUnsafeBytes(of: UInt32(clamping: capacity).bigEndian, Array.init)
        bytes += withUnsafeBytes(of: UInt64(committedEnd).bigEndian, Array.init)
        return bytes
    }

    /// - Throws: ``IPCError/Code/malformedFrame`` for a short header, bad magic or version, or a
    ///   committed end before the first record.
    init(parsing bytes: UnsafeRawBufferPointer) throws {
        guard bytes.count >= Self.length, Array(bytes[0..<4]) == Self.magic, bytes[4] == Self.version else {
            throw IPCError(code: .malformedFrame, message: "not a version \(Self.version) journal: bad or short header")
        }
        ownerPID = Int32(bitPattern: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self).bigEndian)
        capacity = Int(bytes.loadUnaligned(fromByteOffset: 12, as: UInt32.self).bigEndian)
        let end = bytes.loadUnaligned(fromByteOffset: Self.committedEndOffset, as: UInt64.self).bigEndian
        guard end >= UInt64(Self.length), end <= UInt64(Int.max) else {
            throw IPCError(code: .malformedFrame, message: "journal header has committed end \(end)")
        }
        committedEnd = Int(end)
    }
}

/// What a journal record is for.
enum RecordKind: UInt8 {
    /// A binary frame follows the record header.
    case frame = 1
    /// Version 1's handshake (now on the rendezvous socket, ``RendezvousHello``); a reader
    /// skips these records.
    case hello = 2
    /// Version 1's handshake; skipped.
    case welcome = 3
    /// Either way: the sender is ending the connection.
    case goodbye = 4
}

/// What a client sends on the endpoint's rendezvous socket (`G/<endpoint>.rendezvous`) after
/// creating its journal: 16 bytes, big-endian. The listener answers with a
/// ``RendezvousStatus`` word and both keep the socket open for the connection's life: its end
/// of file tells either side that the other's process is gone, at once (see docs/WIRE-FORMAT.md,
/// section 7).
///
///     offset size field
///     0      4    magic 0x49 0x50 0x46 0x48 ("IPFH")
///     4      4    version, 3 (the journal version)
///     8      4    the client's pid (the listener checks it against SO_PEERCRED)
///     12     4    the client's serial (its files are G/<endpoint>.<pid>-<serial>.journal and .outbox)
enum RendezvousHello {
    static let length = 16
    static let magic: UInt32 = 0x4950_4648

    static func bytes(_ sender: SenderID) -> [UInt8] {
        [magic, UInt32(JournalHeader.version), UInt32(bitPattern: sender.pid), sender.serial].flatMap { withUnsafeBytes(of: $0.bigEndian, Array.init) }
    }

    /// The sender a hello names, if it is this version's hello.
    static func sender(parsing bytes: ArraySlice<UInt8>) -> SenderID? {
        guard bytes.count == length else { return nil }
        let words = stride(from: bytes.startIndex, to: bytes.endIndex, by: 4).map { start in
            bytes[start..<start + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        }
        guard words[0] == magic, words[1] == UInt32(JournalHeader.version), words[3] != 0 else { return nil }
        return SenderID(pid: Int32(bitPattern: words[2]), serial: words[3])
    }

    static func socketPath(_ endpoint: Endpoint) -> String {
        endpoint.path(suffix: ".rendezvous")
    }
}

/// Identifies the writer of a record in the listener's inbox: a client's pid and a number that
/// the client's process does not reuse. The listener writes its own records with serial 0.
struct SenderID: Hashable, CustomStringConvertible {
    var pid: Int32
    var serial: UInt32

    var description: String { "\(pid)-\(serial)" }
}

/// The 12 bytes before each record's frame.
///
///     offset size field
///     0      2    magic 0x46 0x52 ("FR")
///     2      1    kind (RecordKind)
///     3      1    zero
///     4      4    sender pid, big-endian
///     8      4    sender serial, big-endian
///     12     n    for kind 1 (frame): a binary frame, 20-byte header and payload; else nothing
struct RecordHeader {
    static let length = 12
    static let magic: (UInt8, UInt8) = (0x46, 0x52)

    var kind: RecordKind
    var sender: SenderID

    var bytes: [UInt8] {
        var bytes = [Self.magic.0, Self.magic.1, kind.rawValue, 0]
        bytes += withUnsafeBytes(of: UInt32(bitPattern: sender.pid).bigEndian, Array.init)
        bytes += withUnsafeBytes(of: sender.serial.bigEndian, Array.init)
        return bytes
    }

    init(kind: RecordKind, sender: SenderID) {
        self.kind = kind
        self.sender = sender
    }

    init(parsing bytes: UnsafeRawBufferPointer) throws {
        guard bytes.count >= Self.length else {
            throw IPCError(code: .truncatedFrame, message: "the committed part of the journal ends inside a record header")
        }
        guard bytes[0] == Self.magic.0, bytes[1] == Self.magic.1, bytes[3] == 0, let kind = RecordKind(rawValue: bytes[2]) else {
            throw IPCError(code: .malformedFrame, message: "bad journal record header \(Array(bytes[0..<4]))")
        }
        self.kind = kind
        sender = SenderID(
            pid: Int32(bitPattern: bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self).bigEndian),
            serial: bytes.loadUnaligned(fromByteOffset: 8, as: UInt32.self).bigEndian
        )
    }
}

/// One record read from a journal.
enum JournalRecord {
    case control(RecordHeader)
    /// A frame with a payload of its own. `offered`: a one-way message the reader's `lend`
    /// offered to a borrowing handler, which declined it (it must not be offered again); `false`
    /// for one it did not offer (no `lend`, or ``JournalLending/notOffered``), which the
    /// connection that receives it offers as usual.
    case frame(RecordHeader, Frame, offered: Bool)
    /// A frame whose payload is above the reader's maximum; it was skipped, not buffered twice.
    case oversized(RecordHeader, IPCError)
    /// A one-way message whose payload was lent, in place, to the reader's `lend` and taken by
    /// it: consumed, nothing more to do.
    case lent(RecordHeader)

    var header: RecordHeader {
        switch self {
        case .control(let header), .frame(let header, _, _), .oversized(let header, _), .lent(let header): header
        }
    }
}

/// Offers a one-way message's payload, in place and only for the call, to whoever will take it.
typealias JournalLender = (RecordHeader, FrameHeader, UnsafeRawBufferPointer) -> JournalLending

/// What became of a message a ``JournalLender`` was given.
enum JournalLending {
    /// A borrowing handler took it: nothing more to do.
    case taken
    /// A borrowing handler declined it: it is dispatched without being offered again.
    case declined
    /// Nobody was offered it (say, its sender is not a connection yet): the connection that
    /// receives it later offers it as usual.
    case notOffered
}

extension JournalRecord {
    /// Decodes the record at the start of `bytes`, which hold only committed (whole) records.
    /// - Returns: the record and its length.
    /// - Throws: ``IPCError/Code/malformedFrame`` or ``IPCError/Code/truncatedFrame``: the
    ///   journal cannot be read on from here.
    /// - Parameter lend: with `offering`, offered each one-way message within the maximum
    ///   first, in place; a message it takes is `.lent` and never copied. It does not escape,
    ///   so a closure made per call costs no allocation.
    static func decode(
        _ bytes: UnsafeRawBufferPointer, maximumPayloadLength: Int, offering: Bool, _ lend: (RecordHeader, FrameHeader, UnsafeRawBufferPointer) -> JournalLending
    ) throws -> (JournalRecord, Int) {
        let header = try RecordHeader(parsing: bytes)
        guard header.kind == .frame else { return (.control(header), RecordHeader.length) }
        let frameBytes = UnsafeRawBufferPointer(rebasing: bytes[RecordHeader.length...])
        guard frameBytes.count >= BinaryWireFormat.headerLength else {
            throw IPCError(code: .truncatedFrame, message: "the committed part of the journal ends inside a frame header")
        }
        let payloadLength = Int(frameBytes.loadUnaligned(fromByteOffset: 16, as: UInt32.self).bigEndian)
        let length = RecordHeader.length + BinaryWireFormat.headerLength + payloadLength
        guard bytes.count >= length else {
            throw IPCError(code: .truncatedFrame, message: "the committed part of the journal ends inside a frame of \(payloadLength) bytes")
        }
        var decoder = BinaryFrameDecoder(maximumPayloadLength: maximumPayloadLength)
        do {
            var offered = false
            if offering, case .frame(let frameHeader, let headerLength)? = try decoder.decodeInPlace(frameBytes), frameHeader.kind == .message {
                switch lend(header, frameHeader, UnsafeRawBufferPointer(rebasing: frameBytes[headerLength..<(headerLength + frameHeader.payloadLength)])) {
                case .taken: return (.lent(header), length)
                case .declined: offered = true
                case .notOffered: break
                }
            }
            guard case .frame(let frame, _) = try decoder.decode(frameBytes) else {
                throw IPCError(code: .truncatedFrame, message: "frame of \(payloadLength) bytes is incomplete")
            }
            return (.frame(header, frame, offered: offered), length)
        } catch let error as IPCError where error.code == .frameTooLarge {
            // The record's length is known, so the journal stays readable past it.
            return (.oversized(header, error), length)
        }
    }
}

/// The files of a file presenter endpoint, `<group>/<name>` plus a suffix.
enum JournalNames {
    /// A client's journal, which the listener appends to and the client reads.
    static func clientJournal(_ endpoint: Endpoint, sender: SenderID) -> String {
        endpoint.path(suffix: ".\(sender.pid)-\(sender.serial).journal")
    }

    /// A client's outbox, which the client appends to and the listener reads: each client has
    /// its own, so a client that stalls holding its lock holds up no one else.
    static func clientOutbox(_ endpoint: Endpoint, sender: SenderID) -> String {
        endpoint.path(suffix: ".\(sender.pid)-\(sender.serial).outbox")
    }

    /// The sender id encoded in a client journal's or outbox's file name, if `fileName` is one
    /// of `endpoint`'s.
    static func sender(ofClientFile fileName: String, endpoint: Endpoint) -> SenderID? {
        let prefix = endpoint.name + "."
        guard fileName.hasPrefix(prefix), let suffix = [".journal", ".outbox"].first(where: { fileName.hasSuffix($0) }) else { return nil }
        let middle = fileName.dropFirst(prefix.count).dropLast(suffix.count)
        let parts = middle.split(separator: "-")
        guard parts.count == 2, let pid = Int32(parts[0]), let serial = UInt32(parts[1]) else { return nil }
        return SenderID(pid: pid, serial: serial)
    }
}
