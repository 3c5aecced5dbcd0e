import Glibc
import IPCCore

/// The toy's packet I/O on `AF_UNIX` `SOCK_SEQPACKET` sockets (made by `IPCSystem.UnixSocket`).
/// A sequenced-packet socket keeps message boundaries, so a message is one packet and needs no
/// framing: a 13-byte header (kind, msgid and correlation, big-endian) and the payload.
enum PacketSocket {
    static let headerLength = 13

    /// Retries a call while it fails with `EINTR`; returns its result, or throws its errno.
    static func retrying(_ call: () -> Int) -> (result: Int, errno: Int32) {
        while true {
            let result = call()
            if result >= 0 || errno != EINTR { return (result, result >= 0 ? 0 : errno) }
        }
    }

    static func failure(_ call: String, _ code: Int32) -> IPCError {
        IPCError(code: .transportFailure, message: "\(call) failed: \(String(cString: strerror(code)))")
    }

    /// Sends one packet if the socket has room now: its length, or 0 if it has none.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer is gone.
    static func sendIfReady(_ fd: CInt, _ packet: [UInt8]) throws -> Int {
        let (result, code) = retrying {
            packet.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        }
        if result >= 0 { return result }
        switch code {
        case EAGAIN: return 0
        case EPIPE, ECONNRESET, ENOTCONN: throw IPCError(code: .peerInvalidated, message: "the peer closed the connection")
        default: throw failure("send", code)
        }
    }

    /// Takes the next packet if one is waiting: the packet, an empty array at end of stream, or
    /// `nil` if none is there.
    /// - Throws: ``IPCError/Code/frameTooLarge`` for a packet above `maximumLength`, before
    ///   allocating for it.
    static func receiveIfReady(_ fd: CInt, maximumLength: Int) throws -> [UInt8]? {
        // Peek at the packet's real length (MSG_TRUNC) without taking it.
        let (length, code) = retrying { recv(fd, nil, 0, CInt(MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT)) }
        if length < 0, code == EAGAIN { return nil }
        // A peer that closed with our packets unread leaves ECONNRESET, reported once and ahead
        // of the packets it sent before closing (a refusal among them): read on past it.
        if length < 0, code == ECONNRESET { return try receiveIfReady(fd, maximumLength: maximumLength) }
        if length == 0 { return [] }
        guard length > 0 else { throw failure("recv", code) }
        guard length <= maximumLength else {
            throw IPCError(code: .frameTooLarge, message: "a packet of \(length) bytes is above the maximum of \(maximumLength)")
        }
        var packet = [UInt8](repeating: 0, count: length)
        let (received, receiveCode) = retrying { packet.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, CInt(MSG_DONTWAIT)) } }
        guard received == length else { throw failure("recv", receiveCode) }
        return packet
    }
}
