import Foundation
import Synchronization

/// The payloads a soak sends: a sequence number (8 bytes, big-endian) and filler derived from it,
/// so an echo or reply can be checked byte for byte without remembering what was sent. Most are
/// short; every 41st is 20,000 bytes, more than one message-queue message, so fragmented
/// messages are cut by kills too.
public enum SoakPayload {
    public static func make(_ sequence: UInt64) -> [UInt8] {
        let fillerLength = sequence % 41 == 40 ? 20_000 : Int((sequence &* 2_654_435_761) % 97)
        var bytes = withUnsafeBytes(of: sequence.bigEndian, Array.init)
        bytes.reserveCapacity(8 + fillerLength)
        for index in 0..<fillerLength {
            bytes.append(UInt8(truncatingIfNeeded: sequence &+ UInt64(index) &* 7))
        }
        return bytes
    }

    /// The sequence number a payload carries, or `nil` if it is too short to carry one.
    public static func sequence(of payload: [UInt8]) -> UInt64? {
        guard payload.count >= 8 else { return nil }
        return payload.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }

    /// The msgid a one-way message with this sequence number is sent with (the peer echoes it).
    public static func msgid(_ sequence: UInt64) -> UInt32 {
        UInt32(truncatingIfNeeded: sequence)
    }
}

/// What one cycle, or a transport's cycles together, sent and got back.
///
/// A message is *acknowledged* when its echo (one-way message) or its reply (request) came
/// back: the peer provably received it. The guarantees checked are about acknowledged messages;
/// a message still in flight when the peer was killed may be lost, so `sent - acknowledged` is
/// reported but allowed (except in a clean cycle, where the peer is stopped, not killed).
public struct DeliveryTally: Codable, Sendable, Equatable {
    /// One-way messages and requests whose send returned without error.
    public var sent = 0
    /// Distinct messages whose echo or reply came back.
    public var acknowledged = 0
    /// Echoes and replies received, duplicates included.
    public var delivered = 0
    /// Echoes of a message already echoed.
    public var duplicates = 0
    /// Echoes that came after the echo of a later message.
    public var outOfOrder = 0
    /// One-way messages sent before an acknowledged one (or, in a clean cycle, at all) whose
    /// echo never came: with in-order delivery, an acknowledged message proves every earlier one
    /// was delivered.
    public var lost = 0
    /// Echoes or replies whose payload or msgid is not what was sent, or echoes whose sequence
    /// number was never sent as a one-way message.
    public var corrupt = 0

    public init() {}

    public var violations: Int { duplicates + outOfOrder + lost + corrupt }

    public mutating func add(_ other: DeliveryTally) {
        sent += other.sent
        acknowledged += other.acknowledged
        delivered += other.delivered
        duplicates += other.duplicates
        outOfOrder += other.outOfOrder
        lost += other.lost
        corrupt += other.corrupt
    }
}

/// What a cycle did, in the order it did it, for ``DeliveryCheck/verify(_:requireAll:)``.
public struct DeliveryLog: Sendable {
    /// Sequence numbers of one-way messages whose send returned, in send order.
    public var sentOneWay: [UInt64] = []
    /// Every sequence number handed to a one-way send, including sends that threw.
    public var attempted: Set<UInt64> = []
    /// Requests whose send returned: those that got a reply, and those that failed after it.
    public var sentRequests = 0
    /// Echoes, in arrival order.
    public var echoes: [(msgid: UInt32, payload: [UInt8])] = []
    /// Replies, each with the sequence number of its request.
    public var replies: [(sequence: UInt64, payload: [UInt8])] = []

    public init() {}
}

public enum DeliveryCheck {
    /// Checks that every acknowledged message was delivered exactly once and in order.
    /// - Parameter requireAll: the peer was stopped, not killed: every message sent must be
    ///   acknowledged.
    public static func verify(_ log: DeliveryLog, requireAll: Bool = false) -> DeliveryTally {
        var tally = DeliveryTally()
        tally.sent = log.sentOneWay.count + log.sentRequests
        var echoed: Set<UInt64> = []
        var highest: UInt64?
        for echo in log.echoes {
            tally.delivered += 1
            guard let sequence = SoakPayload.sequence(of: echo.payload), log.attempted.contains(sequence),
                echo.payload == SoakPayload.make(sequence), echo.msgid == SoakPayload.msgid(sequence)
            else {
                tally.corrupt += 1
                continue
            }
            guard echoed.insert(sequence).inserted else {
                tally.duplicates += 1
                continue
            }
            if let highest, sequence < highest {
                tally.outOfOrder += 1
            }
            highest = max(highest ?? sequence, sequence)
        }
        let sentOneWay = Set(log.sentOneWay)
        for sequence in log.sentOneWay where !echoed.contains(sequence) {
            if requireAll || sequence < (highest ?? 0) { tally.lost += 1 }
        }
        tally.acknowledged = echoed.count
        var replied: Set<UInt64> = []
        for reply in log.replies {
            tally.delivered += 1
            guard !sentOneWay.contains(reply.sequence), reply.payload == SoakPayload.make(reply.sequence) else {
                tally.corrupt += 1
                continue
            }
            if replied.insert(reply.sequence).inserted {
                tally.acknowledged += 1
            } else {
                tally.duplicates += 1
            }
        }
        return tally
    }
}

/// Echoes as a connection's reader receives them, shared with the thread that checks them.
final class EchoLog: Sendable {
    private let entries = Mutex<[(msgid: UInt32, payload: [UInt8])]>([])

    func append(msgid: UInt32, payload: [UInt8]) {
        entries.withLock { $0.append((msgid, payload)) }
    }

    var count: Int { entries.withLock { $0.count } }
    var all: [(msgid: UInt32, payload: [UInt8])] { entries.withLock { $0 } }
}
