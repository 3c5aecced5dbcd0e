/// What a transport offers. The conformance suite skips (reports "not applicable") the cases whose
/// capability a transport does not declare, and the harness prints them beside its numbers.
public struct TransportCapabilities: Sendable, Hashable, Codable {
    /// How a transport learns that its peer went away.
    public enum PeerDeathDetection: String, Sendable, Hashable, Codable {
        /// The kernel closes the connection when the peer's last descriptor closes (end of file).
        case connectionClosed
        /// The transport watches the peer's process (a pidfd), so death is seen even if another
        /// process still holds the peer's descriptors.
        case processWatch
        /// The transport cannot detect peer death.
        case none
    }

    /// The largest payload one message may carry, in bytes.
    public var maximumPayloadLength: Int
    /// Messages from one sender arrive in the order they were sent.
    public var preservesOrder: Bool
    /// `request(_:msgid:sendTimeout:receiveTimeout:)` is supported.
    public var supportsRequestReply: Bool
    /// A listener can send one message to all of its connections.
    public var supportsBroadcast: Bool
    /// A listener can be given an accept filter that sees kernel-verified peer credentials.
    public var supportsAcceptFilter: Bool
    public var peerDeathDetection: PeerDeathDetection
    /// The connection honours ``ConnectionOptions/waitStrategy``: it can poll for the peer's
    /// messages without sleeping. A transport without this ignores the strategy and blocks.
    public var supportsSpinning: Bool
    /// A listener honours ``ConnectionOptions/maximumConnections``.
    public var supportsConnectionLimit: Bool

    public init(
        maximumPayloadLength: Int,
        preservesOrder: Bool,
        supportsRequestReply: Bool,
        supportsBroadcast: Bool,
        supportsAcceptFilter: Bool,
        peerDeathDetection: PeerDeathDetection,
        supportsSpinning: Bool = false,
        supportsConnectionLimit: Bool = false
    ) {
        self.maximumPayloadLength = maximumPayloadLength
        self.preservesOrder = preservesOrder
        self.supportsRequestReply = supportsRequestReply
        self.supportsBroadcast = supportsBroadcast
        self.supportsAcceptFilter = supportsAcceptFilter
        self.peerDeathDetection = peerDeathDetection
        self.supportsSpinning = supportsSpinning
        self.supportsConnectionLimit = supportsConnectionLimit
    }

    private enum CodingKeys: String, CodingKey {
        case maximumPayloadLength, preservesOrder, supportsRequestReply, supportsBroadcast, supportsAcceptFilter, peerDeathDetection, supportsSpinning, supportsConnectionLimit
    }

    /// Reads capabilities written before ``supportsConnectionLimit`` existed as without it.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        maximumPayloadLength = try container.decode(Int.self, forKey: .maximumPayloadLength)
        preservesOrder = try container.decode(Bool.self, forKey: .preservesOrder)
        supportsRequestReply = try container.decode(Bool.self, forKey: .supportsRequestReply)
        supportsBroadcast = try container.decode(Bool.self, forKey: .supportsBroadcast)
        supportsAcceptFilter = try container.decode(Bool.self, forKey: .supportsAcceptFilter)
        peerDeathDetection = try container.decode(PeerDeathDetection.self, forKey: .peerDeathDetection)
        supportsSpinning = try container.decode(Bool.self, forKey: .supportsSpinning)
        supportsConnectionLimit = try container.decodeIfPresent(Bool.self, forKey: .supportsConnectionLimit) ?? false
    }
}
