import IPCCore
import IPCEngine
import IPCSystem
import SystemPackage

/// One end of a toy connection: the engine's connection over a ``ToyChannel``. Request/reply,
/// timeouts, cancellation, the message stream and invalidation all come from the engine.
public typealias ToyConnection = EngineConnection

/// What the engine needs of one sequenced-packet socket: a packet is a whole frame (a 13-byte
/// header of kind, msgid and correlation, big-endian, then the payload), so there is no partial
/// frame to keep, and a packet is written whole or not at all.
final class ToyChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: `packet` is touched on the event loop's thread only (EngineChannel's contract).
    let descriptor: FileDescriptor
    private let maximumPayloadLength: Int
    private var packet: [UInt8]?

    init(fd: FileDescriptor, maximumPayloadLength: Int) {
        descriptor = fd
        self.maximumPayloadLength = min(maximumPayloadLength, ToyTransport.maximumPayloadLength)
    }

    func readAvailable() throws -> Int? {
        guard let bytes = try PacketSocket.receiveIfReady(descriptor.rawValue, maximumLength: PacketSocket.headerLength + maximumPayloadLength) else {
            return nil
        }
        // End of stream is an empty read; every real packet has at least a header.
        guard !bytes.isEmpty else { return 0 }
        packet = bytes
        return bytes.count
    }

    func nextFrame() throws -> Frame? {
        guard let bytes = packet else { return nil }
        packet = nil
        guard bytes.count >= PacketSocket.headerLength, let kind = Frame.Kind(rawValue: bytes[0]) else {
            throw IPCError(code: .malformedFrame, message: "a packet of \(bytes.count) bytes is not a toy frame")
        }
        return Frame(
            kind: kind,
            msgid: bytes[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) },
            correlation: bytes[5..<13].reduce(UInt64(0)) { $0 << 8 | UInt64($1) },
            payload: Array(bytes[PacketSocket.headerLength...])
        )
    }

    var hasPartialFrame: Bool { false }

    func finishReading() throws {}

    func encodedLength(of frame: Frame) throws -> Int {
        guard frame.payload.count <= maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "a payload of \(frame.payload.count) bytes is above the maximum of \(maximumPayloadLength)")
        }
        return PacketSocket.headerLength + frame.payload.count
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        try PacketSocket.sendIfReady(descriptor.rawValue, Self.packet(frame))
    }

    /// A frame's packet: kind, msgid and correlation (big-endian), then the payload.
    static func packet(_ frame: Frame) -> [UInt8] {
        var bytes = [frame.kind.rawValue]
        withUnsafeBytes(of: frame.msgid.bigEndian) { bytes += $0 }
        withUnsafeBytes(of: frame.correlation.bigEndian) { bytes += $0 }
        return bytes + frame.payload
    }

    func shutdown() {
        UnixSocket.shutdown(descriptor)
    }

    func close() {
        try? descriptor.close()
    }
}
