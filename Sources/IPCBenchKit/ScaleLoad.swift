public import Foundation
import CIPCShims
import Glibc
public import IPCCore
import IPCEngine
import IPCFraming
import IPCSystem
import UnixSocketTransport
import IPCConformance
import SystemPackage

/// The other clients of a scale measurement (``ScaleRunner``), run by the hidden `ipcbench load`
/// subcommand in a process of their own: `clients` connections to a Unix socket server, each
/// making echo requests (``PeerRequest/echo``) at a fixed rate until standard input closes.
///
/// Each client has at most one request outstanding, like a real request/reply client: it sends
/// at its next slot (`1 / requestsPerSecond` apart; the clients' first slots are spread evenly
/// over one interval, so the server sees a steady stream rather than bursts of `clients`), and a
/// slot that passes while its reply is still awaited is skipped, not made up later. The rate
/// achieved (``Report``) therefore falls below the one offered when the server cannot keep up.
///
/// The generator is one thread: non-blocking sockets, `poll` and `nanosleep` until the next slot,
/// and the transport's own binary framing (encoder and reassembler) on the wire. That keeps the
/// load process's own CPU time small on a two-core machine, where every cycle it spends is taken
/// from the server or the measuring client. An unthrottled flood (every client sending as fast
/// as it can) would instead measure CPU saturation: 64 senders on 2 vCPUs always win the cores,
/// whatever the server does to be fair.
public struct ScaleLoad: Sendable {
    /// The server's endpoint (a Unix socket server with binary framing).
    public var endpoint: Endpoint
    public var clients: Int
    /// Requests each client sends per second.
    public var requestsPerSecond: Double
    public var payloadBytes: Int

    public init(endpoint: Endpoint, clients: Int, requestsPerSecond: Double, payloadBytes: Int) {
        self.endpoint = endpoint
        self.clients = clients
        self.requestsPerSecond = requestsPerSecond
        self.payloadBytes = payloadBytes
    }

    /// What one load run did, printed by `ipcbench load` as one line when it ends.
    public struct Report: Sendable, Equatable {
        /// Replies received (requests the server served).
        public var served: UInt64
        /// Requests sent.
        public var sent: UInt64
        /// Slots skipped because the client's previous reply had not come yet.
        public var skipped: UInt64
        /// From the first slot to the end, in nanoseconds.
        public var nanoseconds: UInt64

        /// Requests served per second.
        public var servedPerSecond: Double { nanoseconds > 0 ? Double(served) * 1e9 / Double(nanoseconds) : 0 }

        public var line: String { "SERVED \(served) SENT \(sent) SKIPPED \(skipped) NANOSECONDS \(nanoseconds)" }
    }

    private final class Client {
        let fd: FileDescriptor
        let reassembler = Framing.binary.makeReassembler(maximumPayloadLength: 1 << 20)
        var nextSlot: UInt64
        var outstanding = false

        init(fd: FileDescriptor, nextSlot: UInt64) {
            self.fd = fd
            self.nextSlot = nextSlot
        }
    }

    /// Connects every client; then `ready()`; then sends until `stopDescriptor` (standard input)
    /// is readable at end of file or fails, and returns what was done.
    /// - Throws: ``IPCError`` if a client cannot connect, or a connection fails while sending.
    public func run(stopDescriptor: CInt = STDIN_FILENO, ready: () -> Void) throws -> Report {
        var descriptors: [FileDescriptor] = []
        defer { descriptors.forEach { try? $0.close() } }
        for _ in 0..<clients {
            // The peer accepts its clients on its loop; one that stopped doing so fails the run.
            let fd = try UnixSocket.connect(path: UnixSocketTransport.socketPath(endpoint), timeout: .seconds(30)) { true }
            descriptors.append(fd)
            _ = fcntl(fd.rawValue, F_SETFL, fcntl(fd.rawValue, F_GETFL) | O_NONBLOCK)
        }
        let interval = UInt64(1e9 / requestsPerSecond)
        let frame = try Framing.binary.makeEncoder(maximumPayloadLength: 1 << 20)
            .encode(Frame(kind: .request, msgid: PeerRequest.echo, correlation: 1, payload: [UInt8](repeating: 0x3C, count: payloadBytes)))
        ready()
        let start = monotonicNanoseconds()
        let population = descriptors.enumerated().map { index, fd in
            Client(fd: fd, nextSlot: start + interval * UInt64(index) / UInt64(max(1, clients)))
        }
        var report = Report(served: 0, sent: 0, skipped: 0, nanoseconds: 0)
        var polled = [pollfd(fd: stopDescriptor, events: Int16(POLLIN), revents: 0)]
            + population.map { pollfd(fd: $0.fd.rawValue, events: Int16(POLLIN), revents: 0) }
        while true {
            // Replies first, so a client whose reply is in is free for its slot.
            if poll(&polled, nfds_t(polled.count), 0) > 0 {
                if polled[0].revents != 0 { break }
                for (index, client) in population.enumerated() where polled[index + 1].revents != 0 {
                    report.served += try receive(client)
                }
            }
            let now = monotonicNanoseconds()
            var earliest = UInt64.max
            for client in population {
                if now >= client.nextSlot {
                    if client.outstanding {
                        report.skipped += 1
                    } else {
                        try send(frame, on: client.fd.rawValue)
                        client.outstanding = true
                        report.sent += 1
                    }
                    client.nextSlot += interval
                    // A client far behind (the process was descheduled) restarts from now
                    // rather than sending a burst to catch up.
                    if client.nextSlot < now { client.nextSlot = now + interval }
                }
                earliest = min(earliest, client.nextSlot)
            }
            // Sleep until the next slot: `poll` (which also wakes for replies and for standard
            // input) counts whole milliseconds, so shorter waits sleep with `nanosleep` and the
            // replies that come meanwhile are read at the top of the loop.
            let wait = earliest > now ? earliest - now : 0
            if wait >= 2_000_000 {
                _ = poll(&polled, nfds_t(polled.count), Int32(wait / 1_000_000))
            } else if wait > 0 {
                var duration = timespec(tv_sec: 0, tv_nsec: Int(wait))
                nanosleep(&duration, nil)
            }
        }
        report.nanoseconds = monotonicNanoseconds() - start
        return report
    }

    /// Writes a whole request frame on a non-blocking socket (small frames always fit a socket's
    /// buffer while the client has no request outstanding; if the buffer is full, waits for room).
    private func send(_ frame: [UInt8], on fd: CInt) throws {
        var offset = 0
        while offset < frame.count {
            let count = frame.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, frame.count - offset, CInt(MSG_NOSIGNAL)) }
            if count > 0 {
                offset += count
            } else if count < 0, errno == EAGAIN || errno == EINTR {
                var descriptor = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                _ = poll(&descriptor, 1, 100)
            } else {
                throw IPCError(code: .peerInvalidated, message: "a load client's send failed: errno \(errno)")
            }
        }
    }

    /// Reads what is there and returns the number of replies it completed.
    private func receive(_ client: Client) throws -> UInt64 {
        var replies: UInt64 = 0
        while true {
            let count = try client.reassembler.receive { buffer in
                try UnixSocket.readIfReady(client.fd, into: buffer) ?? -1
            }
            if count == 0 { throw IPCError(code: .peerInvalidated, message: "the server closed a load client's connection") }
            if count < 0 { break }
            while let frame = try client.reassembler.nextFrame() {
                guard frame.kind == .reply else {
                    throw IPCError(code: .malformedPayload, message: "a load client received a \(frame.kind) frame instead of a reply")
                }
                replies += 1
                client.outstanding = false
            }
        }
        return replies
    }
}

extension ScaleLoad.Report {
    /// Reads ``line`` from anywhere in `output`.
    public init?(output: String) {
        guard let line = output.split(separator: "\n").last(where: { $0.hasPrefix("SERVED ") }) else { return nil }
        let words = line.split(separator: " ")
        guard words.count == 8, let served = UInt64(words[1]), let sent = UInt64(words[3]),
            let skipped = UInt64(words[5]), let nanoseconds = UInt64(words[7])
        else { return nil }
        self.init(served: served, sent: sent, skipped: skipped, nanoseconds: nanoseconds)
    }
}
