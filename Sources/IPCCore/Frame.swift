/// One message on the wire: a small header and an opaque payload.
///
/// Every framing carries the same fields; see `docs/WIRE-FORMAT.md` for their encodings.
public struct Frame: Sendable, Hashable {
    /// What the frame is for. Unknown raw values are refused by decoders.
    public enum Kind: UInt8, Sendable, Hashable, CaseIterable {
        /// A one-way message; no reply is expected.
        case message = 1
        /// A request; the receiver answers with `.reply` or `.failure` carrying the same correlation id.
        case request = 2
        /// A successful reply to the request with the same correlation id.
        case reply = 3
        /// The request with the same correlation id failed in the receiver's handler; the payload is
        /// a UTF-8 description.
        case failure = 4
    }

    public var kind: Kind
    /// An application-defined message identifier (the `msgid` of `CFMessagePortSendRequest`).
    public var msgid: UInt32
    /// Pairs a reply with its request. Zero for one-way messages.
    public var correlation: UInt64
    public var payload: [UInt8]

    @inlinable
    public init(kind: Kind, msgid: UInt32 = 0, correlation: UInt64 = 0, payload: [UInt8] = []) {
        self.kind = kind
        self.msgid = msgid
        self.correlation = correlation
        self.payload = payload
    }
}

/// The fields of a frame other than its payload bytes.
public struct FrameHeader: Sendable, Hashable {
    public var kind: Frame.Kind
    public var msgid: UInt32
    public var correlation: UInt64
    public var payloadLength: Int

    @inlinable
    public init(kind: Frame.Kind, msgid: UInt32, correlation: UInt64, payloadLength: Int) {
        self.kind = kind
        self.msgid = msgid
        self.correlation = correlation
        self.payloadLength = payloadLength
    }

    @inlinable
    public init(_ frame: Frame) {
        self.init(kind: frame.kind, msgid: frame.msgid, correlation: frame.correlation, payloadLength: frame.payload.count)
    }
}

/// The next frame from a receive path that can lend payloads in place (see
/// ``ConnectionOptions/makeOnLoopBorrowingMessageHandler``).
public enum ReassembledFrame: Sendable {
    /// A frame with a payload of its own.
    case owned(Frame)
    /// A frame whose payload was lent, in place, to the one who asked, and taken by it: it is
    /// consumed and needs nothing more.
    case lent
}
