import CIPCShims
import Glibc
import IPCCore
import IPCSystem

/// What travels in one queue message: a 28-byte fragment header and up to
/// `queue message size - 28` bytes of payload. Specified in `docs/WIRE-FORMAT.md`.
///
///     offset size field
///     0      2    magic 0x4D 0x50 ("MP")
///     2      1    version, 1
///     3      1    kind (PortMessageKind)
///     4      4    msgid, big-endian
///     8      8    correlation id, big-endian
///     16     4    sender: the client id the server assigned; 0 from the server
///     20     4    total payload length of the message, big-endian
///     24     4    offset of this fragment's bytes in the payload, big-endian
///     28     n    fragment bytes
enum PortMessageKind: UInt8 {
    case message = 1, request = 2, reply = 3, failure = 4
    /// Client to server: payload is the client's pid (4 bytes) and its reply queue's name.
    case hello = 16
    /// Server to client: `sender` carries the id assigned to the client.
    case welcome = 17
    /// Either way: the sender is going away.
    case goodbye = 18
    /// Posted by a process into its own queue to wake its reader.
    case wake = 19
    /// Server to client, instead of `welcome`: the listener's accept filter refused the client.
    case refused = 20

    init?(_ kind: Frame.Kind) {
        self.init(rawValue: kind.rawValue)
    }

    var frameKind: Frame.Kind? { Frame.Kind(rawValue: rawValue) }
}

/// Why a `refused` fragment refuses a hello: its `msgid` field.
enum PortRefusal: UInt32 {
    /// The listener's accept filter refused the client.
    case acceptFilter = 0
    /// The client's process already has ``MessagePortListener/maximumClientsPerProcess``
    /// connections to the port.
    case tooManyConnectionsFromProcess = 1
    /// The listener keeps as many connections as its ``IPCCore/ConnectionOptions/maximumConnections``.
    case listenerFull = 2
}

struct PortFragmentHeader {
    static let length = 28
    /// The smallest queue message size (`mq_msgsize`) the transport writes to or reads from: a
    /// header, and room for a hello (a pid and a queue name of up to 255 bytes) in one fragment.
    /// Anyone of the user can make a queue, so a peer's queue can be any size the kernel allows,
    /// down to 1 byte; one smaller than a header could carry no fragment, and one of exactly a
    /// header no payload.
    static let minimumQueueMessageSize = 512

    /// Checks a queue's message size before anything is written to it or read from it.
    /// - Throws: ``IPCError/Code/invalidEndpoint`` below ``minimumQueueMessageSize``.
    static func checkQueueMessageSize(_ size: Int, of what: String) throws {
        guard size >= minimumQueueMessageSize else {
            throw IPCError(code: .invalidEndpoint, message: "\(what) has a message size of \(size) bytes, below the \(minimumQueueMessageSize) a message port needs (docs/WIRE-FORMAT.md 5)")
        }
    }
    static let magic: (UInt8, UInt8) = (0x4D, 0x50)
    static let version: UInt8 = 1

    var kind: PortMessageKind
    var msgid: UInt32 = 0
    var correlation: UInt64 = 0
    var sender: UInt32 = 0
    var totalLength: UInt32 = 0
    var offset: UInt32 = 0

    init(kind: PortMessageKind, msgid: UInt32 = 0, correlation: UInt64 = 0, sender: UInt32 = 0) {
        self.kind = kind
        self.msgid = msgid
        self.correlation = correlation
        self.sender = sender
    }

    func write(to buffer: UnsafeMutableRawBufferPointer) {
        buffer[0] = Self.magic.0
        buffer[1] = Self.magic.1
        buffer[2] = Self.version
        buffer[3] = kind.rawValue
        buffer.storeBytes(of: msgid.bigEndian, toByteOffset: 4, as: UInt32.self)
        buffer.storeBytes(of: correlation.bigEndian, toByteOffset: 8, as: UInt64.self)
        buffer.storeBytes(of: sender.bigEndian, toByteOffset: 16, as: UInt32.self)
        buffer.storeBytes(of: totalLength.bigEndian, toByteOffset: 20, as: UInt32.self)
        buffer.storeBytes(of: offset.bigEndian, toByteOffset: 24, as: UInt32.self)
    }

    /// - Throws: ``IPCError/Code/malformedFrame`` for a short message, bad magic, version or kind,
    ///   or a fragment that claims bytes beyond its message's length.
    init(parsing bytes: UnsafeRawBufferPointer) throws {
        guard bytes.count >= Self.length else {
            throw IPCError(code: .malformedFrame, message: "queue message of \(bytes.count) bytes is shorter than the \(Self.length)-byte fragment header")
        }
        guard bytes[0] == Self.magic.0, bytes[1] == Self.magic.1, bytes[2] == Self.version else {
            throw IPCError(code: .malformedFrame, message: "queue message has bad magic or version")
        }
        guard let kind = PortMessageKind(rawValue: bytes[3]) else {
            throw IPCError(code: .malformedFrame, message: "unknown message port kind \(bytes[3])")
        }
        self.kind = kind
        msgid = bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self).bigEndian
        correlation = bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self).bigEndian
        sender = bytes.loadUnaligned(fromByteOffset: 16, as: UInt32.self).bigEndian
        totalLength = bytes.loadUnaligned(fromByteOffset: 20, as: UInt32.self).bigEndian
        offset = bytes.loadUnaligned(fromByteOffset: 24, as: UInt32.self).bigEndian
        guard UInt64(offset) + UInt64(bytes.count - Self.length) <= UInt64(totalLength) else {
            throw IPCError(code: .malformedFrame, message: "fragment at \(offset) with \(bytes.count - Self.length) bytes overruns its \(totalLength)-byte message")
        }
    }
}

/// Reassembles one sender's fragmented messages. A sender writes each message's fragments
/// contiguously and in order, so there is at most one message in progress per sender.
struct FragmentAssembler {
    let maximumPayloadLength: Int
    private var partial: (header: PortFragmentHeader, payload: [UInt8])?

    init(maximumPayloadLength: Int) {
        self.maximumPayloadLength = maximumPayloadLength
    }

    /// Whether part of a message has arrived and not the rest.
    var isAssembling: Bool { partial != nil }

    /// Whether the fragment `header` (with `byteCount` bytes) is a whole message of a frame kind
    /// within the maximum, whose bytes can be used in place instead of being added. Like
    /// ``add(_:_:)`` of such a fragment, it forgets a message in progress.
    mutating func isWholeMessage(_ header: PortFragmentHeader, byteCount: Int) -> Bool {
        guard header.kind.frameKind != nil, header.offset == 0, byteCount == Int(header.totalLength), byteCount <= maximumPayloadLength else { return false }
        partial = nil
        return true
    }

    /// Adds one fragment; returns the frame once its last fragment has arrived.
    /// - Throws: ``IPCError/Code/frameTooLarge`` for a message above the maximum (before
    ///   allocating for it); ``IPCError/Code/malformedFrame`` for a fragment out of sequence.
    mutating func add(_ header: PortFragmentHeader, _ bytes: UnsafeRawBufferPointer) throws -> Frame? {
        guard let kind = header.kind.frameKind else { return nil }
        if header.offset == 0 {
            guard Int(header.totalLength) <= maximumPayloadLength else {
                throw IPCError(code: .frameTooLarge, message: "message announces \(header.totalLength) bytes, above the maximum of \(maximumPayloadLength)")
            }
            if bytes.count == Int(header.totalLength) {
                partial = nil
                return Frame(kind: kind, msgid: header.msgid, correlation: header.correlation, payload: Array(bytes))
            }
            // Nothing reserved for what is only announced: the payload grows as fragments come.
            let payload = Array(bytes)
            partial = (header, payload)
            return nil
        }
        guard var (first, payload) = partial, first.kind == header.kind, first.correlation == header.correlation,
            first.totalLength == header.totalLength, Int(header.offset) == payload.count
        else {
            partial = nil
            throw IPCError(code: .malformedFrame, message: "fragment at offset \(header.offset) does not continue the message in progress")
        }
        partial = nil
        payload.append(contentsOf: bytes)
        if payload.count == Int(first.totalLength) {
            return Frame(kind: kind, msgid: first.msgid, correlation: first.correlation, payload: payload)
        }
        first.offset = header.offset
        partial = (first, payload)
        return nil
    }
}

/// Writes messages into a queue, fragmenting them to the queue's message size.
struct FragmentWriter {
    let queue: MessageQueue
    let messageSize: Int

    /// Sends one whole message. `sent` counts the fragments the kernel took, so a caller can tell
    /// a clean failure from a torn message.
    func send(_ header: PortFragmentHeader, _ payload: [UInt8], deadline: MessageQueue.Deadline, sent: inout Int) throws {
        _ = try put(header, payload, sent: &sent) { fragment in
            try queue.send(fragment, deadline: deadline)
            return true
        }
    }

    /// Sends the message's fragments from number `sent` on, as many as the queue takes now,
    /// without waiting: whether the whole message is sent. `sent` counts the fragments sent.
    func sendAvailable(_ header: PortFragmentHeader, _ payload: [UInt8], sent: inout Int) throws -> Bool {
        try put(header, payload, sent: &sent) { try queue.sendIfRoom($0) }
    }

    /// Builds the fragments from number `sent` on and gives each to `enqueue`, until it takes
    /// one no more (returns `false`): whether every fragment was taken.
    private func put(
        _ header: PortFragmentHeader, _ payload: [UInt8], sent: inout Int, _ enqueue: (UnsafeRawBufferPointer) throws -> Bool
    ) throws -> Bool {
        let chunk = messageSize - PortFragmentHeader.length
        // Checked where each writer's size is chosen (``PortFragmentHeader/checkQueueMessageSize(_:of:)``);
        // never a trap here should a path miss it.
        guard chunk > 0 else {
            throw IPCError(code: .transportFailure, message: "fragments of \(messageSize) bytes have no room for payload")
        }
        var fragment = header
        fragment.totalLength = UInt32(payload.count)
        var sentNow = sent
        defer { sent = sentNow }
        // Only as large as the largest fragment: a small message's buffer (up to 1 KiB) is then
        // on the stack, where a queue-sized one would be a heap allocation per message.
        return try withUnsafeTemporaryAllocation(byteCount: min(messageSize, PortFragmentHeader.length + payload.count), alignment: 8) { buffer in
            try payload.withUnsafeBytes { bytes in
                var offset = sentNow * chunk
                repeat {
                    let count = min(chunk, bytes.count - offset)
                    fragment.offset = UInt32(offset)
                    fragment.write(to: buffer)
                    if count > 0 {
                        UnsafeMutableRawBufferPointer(rebasing: buffer[PortFragmentHeader.length...])
                            .copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)]))
                    }
                    guard try enqueue(UnsafeRawBufferPointer(rebasing: buffer[..<(PortFragmentHeader.length + count)])) else { return false }
                    sentNow += 1
                    offset += count
                } while offset < bytes.count
                return true
            }
        }
    }

    /// Sends a header-only control message (hello payloads are small enough for one fragment).
    func sendControl(_ header: PortFragmentHeader, payload: [UInt8] = [], deadline: MessageQueue.Deadline) throws {
        var sent = 0
        try send(header, payload, deadline: deadline, sent: &sent)
    }
}

/// Global names for a group's queues. POSIX queue names are one flat, system-wide namespace, so
/// the group directory's path is folded in as a hash to keep groups apart.
enum PortNames {
    static func serverQueue(_ endpoint: Endpoint) -> String {
        "/ipcb.\(groupHash(endpoint.group)).\(endpoint.name)"
    }

    static func replyQueue(_ endpoint: Endpoint, pid: Int32, serial: Int) -> String {
        serverQueue(endpoint) + ".r\(pid).\(serial)"
    }

    /// FNV-1a, 64 bits, in hex: stable across runs and processes (unlike `Hasher`).
    static func groupHash(_ group: GroupDirectory) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in group.path.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        let digits = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
