import Foundation
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing
import UnixSocketTransport
import IPCConformance
import IPCEngine

/// One hostile input for a stream listener, and how the listener must refuse it.
struct HostileStreamInput: Sendable, CustomTestStringConvertible {
    var name: String
    var framing: Framing
    var bytes: [UInt8]
    var code: IPCError.Code
    /// `stall`: the peer keeps the connection open and sends nothing more; `shutdown`: it stops
    /// writing (end of file).
    var ending = "stall"

    var testDescription: String { "\(framing): \(name)" }

    init(_ name: String, _ framing: Framing, _ bytes: [UInt8], _ code: IPCError.Code, ending: String = "stall") {
        self.name = name
        self.framing = framing
        self.bytes = bytes
        self.code = code
        self.ending = ending
    }

    init(_ name: String, http text: String, _ code: IPCError.Code, ending: String = "stall") {
        self.init(name, .http, Array(text.utf8), code, ending: ending)
    }
}

/// Hostile clients (`ipcbench hostile socket`, a second process) against a Unix socket
/// listener, in both framings, while a well-behaved client process on the same listener keeps
/// doing round trips.
@Suite("Hostile peers: unix socket")
struct UnixSocketHostileTests {
    @Test("a delayed echo asking for 2^32 - 1 milliseconds does not kill the peer: the delay is clamped")
    func hugeDelayIsClamped() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("sleepy")
        let server = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server) }
        // Killed: its receive path sleeps out the (clamped) delay.
        defer { server.kill() }
        let connection = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        await expectIPCError(.receiveTimeout) {
            try await connection.request([0xFF, 0xFF, 0xFF, 0xFF], msgid: PeerRequest.delayedEcho, sendTimeout: .seconds(5), receiveTimeout: .seconds(2))
        }
        #expect(server.isRunning, "the peer died on the delay")
        #expect(connection.invalidationReason == nil)
    }

    /// The listener's payload limit in these tests.
    static let maximumPayloadLength = 1 << 20
    /// How long the listener waits for the rest of a frame a peer started.
    static let stallTimeout: Duration = .seconds(2)

    static func binaryHeader(version: UInt8 = 1, kind: UInt8 = 1, length: UInt32, magic: (UInt8, UInt8) = (0x49, 0x50)) -> [UInt8] {
        [magic.0, magic.1, version, kind] + [0, 0, 0, 7] + [UInt8](repeating: 0, count: 8) + withUnsafeBytes(of: length.bigEndian, Array.init)
    }

    static func binaryFrame(_ payload: [UInt8], msgid: UInt32 = 7) throws -> [UInt8] {
        try BinaryFrameEncoder(maximumPayloadLength: maximumPayloadLength).encode(Frame(kind: .message, msgid: msgid, payload: payload))
    }

    static func httpFrame(_ payload: [UInt8], msgid: UInt32 = 7) throws -> [UInt8] {
        try HTTPFrameEncoder(maximumPayloadLength: maximumPayloadLength).encode(Frame(kind: .message, msgid: msgid, payload: payload))
    }

    static let inputs: [HostileStreamInput] = {
        let whole = try! binaryFrame([UInt8](repeating: 0xAB, count: 100))
        let large = try! binaryFrame([UInt8](repeating: 0xCD, count: 1 << 20))
        var inputs: [HostileStreamInput] = [
            .init("garbage magic", .binary, binaryHeader(length: 0, magic: (0x47, 0x45)), .malformedFrame),
            .init("unknown version 2", .binary, binaryHeader(version: 2, length: 0), .malformedFrame),
            .init("unknown version 255", .binary, binaryHeader(version: 255, length: 0), .malformedFrame),
            .init("unknown kind 0", .binary, binaryHeader(kind: 0, length: 0), .malformedFrame),
            .init("length one above the maximum, header only", .binary, binaryHeader(length: UInt32(maximumPayloadLength + 1)), .frameTooLarge),
            .init("length 0x7fffffff (negative as Int32)", .binary, binaryHeader(length: 0x7FFF_FFFF) + [1, 2, 3], .frameTooLarge),
            .init("length 0xffffffff (-1 as Int32, 4 GiB)", .binary, binaryHeader(length: .max) + [1, 2, 3], .frameTooLarge),
            .init("truncated at EOF inside the header", .binary, Array(whole[..<11]), .truncatedFrame, ending: "shutdown"),
            .init("truncated at EOF inside the payload", .binary, Array(whole[..<(whole.count - 1)]), .truncatedFrame, ending: "shutdown"),
            .init("half a header, then a stall", .binary, Array(whole[..<10]), .truncatedFrame),
            .init("a header and part of the payload, then a stall", .binary, Array(whole[..<50]), .truncatedFrame),
            .init("a good frame, then NUL bytes", .binary, whole + [UInt8](repeating: 0, count: 16), .malformedFrame),
            // The rest of a large frame is the kernel's to receive (the loop's transfer ring),
            // unless IPCBENCH_LARGE_TRANSFERS=epoll: its stall and its end are still seen.
            .init("a 1 MiB frame's header and 300 KiB of its payload, then a stall", .binary,
                  binaryHeader(length: 1 << 20) + [UInt8](repeating: 5, count: 300 << 10), .truncatedFrame),
            .init("a 1 MiB frame's header and 300 KiB of its payload, then EOF", .binary,
                  binaryHeader(length: 1 << 20) + [UInt8](repeating: 5, count: 300 << 10), .truncatedFrame, ending: "shutdown"),
            // What follows a large frame whose rest the kernel received is read when it ends.
            .init("a whole 1 MiB frame, then NUL bytes", .binary, large + [UInt8](repeating: 0, count: 16), .malformedFrame),
            .init("a whole 1 MiB frame, then another's header and 300 KiB of its payload, then a stall", .binary,
                  large + binaryHeader(length: 1 << 20) + [UInt8](repeating: 5, count: 300 << 10), .truncatedFrame),
            .init("a whole 1 MiB frame, then another's header and 300 KiB of its payload, then EOF", .binary,
                  large + binaryHeader(length: 1 << 20) + [UInt8](repeating: 5, count: 300 << 10), .truncatedFrame, ending: "shutdown"),
            .init("a whole 1 MiB frame, then half a header, then EOF", .binary, large + Array(whole[..<10]), .truncatedFrame, ending: "shutdown"),
        ]
        let request = "POST /ipc HTTP/1.1\r\nHost: x\r\n"
        inputs += [
            .init("repeated Content-Length", http: request + "Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello", .malformedFrame),
            .init("conflicting Content-Length", http: request + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", .malformedFrame),
            .init("Content-Length list", http: request + "Content-Length: 5, 5\r\n\r\nhello", .malformedFrame),
            .init("negative Content-Length", http: request + "Content-Length: -1\r\n\r\n", .malformedFrame),
            .init("Content-Length with a sign", http: request + "Content-Length: +5\r\n\r\nhello", .malformedFrame),
            .init("Content-Length overflowing 64 bits", http: request + "Content-Length: 99999999999999999999999\r\n\r\n", .malformedFrame),
            .init("Content-Length 2^63 (overflows Int64)", http: request + "Content-Length: 9223372036854775808\r\n\r\n", .malformedFrame),
            .init("Content-Length 2^63 - 1", http: request + "Content-Length: 9223372036854775807\r\n\r\n", .frameTooLarge),
            .init("Content-Length 4 GiB", http: request + "Content-Length: 4294967296\r\n\r\n", .frameTooLarge),
            .init("Transfer-Encoding chunked", http: request + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", .unsupportedFraming),
            .init("Content-Length and Transfer-Encoding", http: request + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", .unsupportedFraming),
            .init("repeated Transfer-Encoding", http: request + "Transfer-Encoding: identity\r\nTransfer-Encoding: identity\r\n\r\n", .unsupportedFraming),
            .init("oversized header line", http: request + "X-Long: " + String(repeating: "a", count: 20_000) + "\r\n\r\n", .frameTooLarge),
            .init("endless header block", http: request + String(repeating: "X-A: b\r\n", count: 4000), .frameTooLarge),
            .init("NUL byte in a header value", http: request + "X-Note: a\u{0}b\r\n\r\n", .malformedFrame),
            .init("NUL byte in the request line", http: "POST /i\u{0}pc HTTP/1.1\r\n\r\n", .malformedFrame),
            .init("unknown version HTTP/2.0", http: "POST /ipc HTTP/2.0\r\n\r\n", .malformedFrame),
            .init("garbage start line", .http, [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03], .malformedFrame),
            .init("bare LF", http: "POST /ipc HTTP/1.1\nContent-Length: 0\n\n", .malformedFrame),
            .init("body truncated at EOF", http: request + "Content-Length: 10\r\n\r\nhello", .truncatedFrame, ending: "shutdown"),
            .init("header block truncated at EOF", http: request + "Content-Len", .truncatedFrame, ending: "shutdown"),
            .init("half a header block, then a stall", http: request + "Content-Len", .truncatedFrame),
            .init("headers, part of the body, then a stall", http: request + "Content-Length: 10\r\n\r\nhel", .truncatedFrame),
            .init("a whole 1 MiB request, then a garbage start line", .http,
                  (try! httpFrame([UInt8](repeating: 0xCD, count: 1 << 20))) + Array("GARBAGE\r\n\r\n".utf8), .malformedFrame),
        ]
        return inputs
    }()

    private func options() -> ConnectionOptions {
        .defaults {
            $0.maximumPayloadLength = Self.maximumPayloadLength
            $0.stalledFrameTimeout = Self.stallTimeout
        }
    }

    @Test("a hostile client gets a typed protocol error and is dropped; a well-behaved client keeps being served", arguments: inputs)
    func hostileClientIsDropped(_ input: HostileStreamInput) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("hostile")
        let listener = try UnixSocketTransport(framing: input.framing).listen(at: endpoint, options: options(), acceptFilter: nil)
        defer { listener.close() }
        let good = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: input.framing, endpoint: endpoint, role: .client) }
        defer { good.stop() }
        let goodConnection = try await nextConnection(from: listener.connections, peer: good.pid, "the well-behaved client")
        let loop = RoundTripLoop(goodConnection, msgid: PeerRequest.echo)

        let hostile = try await HostilePeer.socket(path: endpoint.path(suffix: ".sock"), bytes: input.bytes, then: input.ending)
        let hostileConnection = try await nextConnection(from: listener.connections, peer: hostile.pid, "the hostile client")
        let probe = InvalidationProbe()
        probe.attach(to: hostileConnection)
        #expect(await probe.wait(seconds: 30), "the hostile connection was not invalidated")
        #expect(probe.reason?.kind == .protocolError, "invalidated with \(String(describing: probe.reason))")
        #expect(probe.reason?.error?.code == input.code, "invalidated with \(String(describing: probe.reason))")
        if input.ending == "shutdown" {
            // The end of the stream ended it, read as soon as it came: not the stall timer, which
            // would give the same code if the socket were never read again.
            let message = probe.reason?.error?.message ?? ""
            let byStallTimer = message.contains("and then nothing")
            #expect(!byStallTimer, "invalidated with \(String(describing: probe.reason))")
        }
        try await expectDropped(hostile, input.name)

        await loop.stop()
        #expect(goodConnection.invalidationReason == nil)
        #expect(listener.activeConnections.map { $0.peer?.pid } == [good.pid])
        #expect(try await goodConnection.request([1, 2, 3], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [1, 2, 3])
    }

    @Test("frames written a byte at a time with pauses, by another process, arrive intact", arguments: Framing.allCases)
    func frameSplitAtEveryByte(_ framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("split")
        let listener = try UnixSocketTransport(framing: framing).listen(at: endpoint, options: options(), acceptFilter: nil)
        defer { listener.close() }
        let payload = Array("split at every byte".utf8)
        let frames = try (1...3).map { try framing == .binary ? Self.binaryFrame(payload, msgid: $0) : Self.httpFrame(payload, msgid: $0) }
        let writer = try await HostilePeer.socket(path: endpoint.path(suffix: ".sock"), bytes: frames.flatMap { $0 }, chunk: 1, pauseMicroseconds: 2000, then: "shutdown")
        let connection = try await nextConnection(from: listener.connections, peer: writer.pid, "the byte-at-a-time writer")
        let probe = InvalidationProbe()
        probe.attach(to: connection)
        let received = try await collect(3, from: connection, seconds: 60)
        #expect(received.map(\.msgid) == [1, 2, 3])
        #expect(received.allSatisfy { $0.payload == payload })
        // The stream ended at a frame boundary: a clean close, not an error.
        #expect(await probe.wait(seconds: 30))
        #expect(probe.reason?.kind == .peerClosed, "invalidated with \(String(describing: probe.reason))")
        try await expectDropped(writer, "the byte-at-a-time writer")
    }

    @Test("a flood of 100,000 tiny frames is delivered in full and the stream ends cleanly")
    func floodOfTinyFrames() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("flood")
        let listener = try UnixSocketTransport().listen(at: endpoint, options: options(), acceptFilter: nil)
        defer { listener.close() }
        let count = 100_000
        let flooder = try await HostilePeer.socket(path: endpoint.path(suffix: ".sock"), bytes: try Self.binaryFrame([], msgid: 1), repeatCount: count, then: "shutdown", timeout: 120)
        let connection = try await nextConnection(from: listener.connections, peer: flooder.pid, "the flooder")
        let received = try await withDeadline(seconds: 120, "receiving the flood") {
            var received = 0
            for await message in connection.messages where message.msgid == 1 && message.payload.isEmpty { received += 1 }
            return received
        }
        #expect(received == count)
        #expect(connection.invalidationReason?.kind == .peerClosed)
        try await expectDropped(flooder, "the flooder")
    }

    @Test("hostile clients announcing the largest allowed frame and stalling cost the listener little memory")
    func announcedLengthsDoNotAllocate() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("memory")
        // A listener in a process of its own (default limit: 64 MiB per frame), so its memory is
        // measured alone. It keeps stalled frames for 10 minutes rather than 30 s: on a loaded
        // machine, starting the 64 hostile clients has taken longer than 30 s.
        let server = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .binary, endpoint: endpoint, role: .server, stalledFrameTimeout: .seconds(600)) }
        defer { server.stop() }
        let before = try memoryUsage(of: server.pid)
        let announced = ConnectionOptions.defaults.maximumPayloadLength
        let bytes = Self.binaryHeader(length: UInt32(announced)) + [UInt8](repeating: 1, count: 1000)
        // Started together: one after another, a loaded machine took longer than the listener's
        // stalled-frame timeout (30 s) to start them all, and the first were dropped before the
        // measurement.
        let path = endpoint.path(suffix: ".sock")
        let hostile = try await withThrowingTaskGroup(of: PeerProcess.self) { group in
            for _ in 0..<64 {
                group.addTask { try await HostilePeer.socket(path: path, bytes: bytes) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        defer { hostile.forEach { $0.kill() } }
        // Let the listener read every header.
        let client = try await UnixSocketTransport().connect(to: endpoint, options: .defaults)
        defer { client.invalidate() }
        #expect(try await client.request([9], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [9])
        try await Task.sleep(for: .milliseconds(500))
        let after = try memoryUsage(of: server.pid)
        // Every hostile client was still connected, stalled inside its frame, when the memory was
        // read (the listener drops them after its stalledFrameTimeout, and they then exit).
        #expect(hostile.allSatisfy { $0.isRunning }, "a hostile client was dropped before the listener's memory was measured")
        // 64 × 64 MiB announced: 4 GiB if reserved up front; far less when memory follows the
        // bytes that arrived (a reader thread's stack per connection and malloc arenas, up to
        // about 1.5 GiB of address space, account for the rest).
        #expect(after.virtual - before.virtual < 5 << 29, "virtual memory grew by \((after.virtual - before.virtual) >> 20) MiB")
        #expect(after.resident - before.resident < 128 << 20, "resident memory grew by \((after.resident - before.resident) >> 20) MiB")
    }
}
