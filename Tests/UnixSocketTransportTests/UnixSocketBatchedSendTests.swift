import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCEngine
import IPCFraming
import IPCTestSupport
import SystemPackage
import Testing
@testable import UnixSocketTransport

/// The batched send over a real socket (the unix-socket channel's gathering `sendmsg`, or one
/// `send` of a coalesced copy for small batches), against a peer process that echoes one-way
/// messages.
@Suite("Unix socket: batched sends")
struct UnixSocketBatchedSendTests {
    @Test("batched one-way messages arrive in order, once each, whole across gathered writes, both framings", arguments: Framing.allCases)
    func batchedDelivery(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("batched")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: framing).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        let count = 1_500
        // Sizes vary, some above the socket's buffer and a batch above the bytes one write
        // takes, so that writes stop inside frames and batches span several writes.
        let payloads: [[UInt8]] = (0..<count).map { index in
            withUnsafeBytes(of: UInt32(index).bigEndian, Array.init) + [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: index % 50 == 0 ? 70_000 : index % 300)
        }
        // Alone this takes 0.3 s. In the full suite it shares two CPUs with every other suite's
        // processes and has passed after 52–55 s (three framings at once), and once, in CI, a
        // framing did not finish within 30 s: the deadlines catch a hang, generously.
        let sender = Task.detached {
            var next = 0
            var batch = 1
            while next < count {
                let end = min(count, next + batch)
                try await connection.send(contentsOf: Array(payloads[next..<end]), msgid: 7, timeout: .seconds(120))
                next = end
                batch = batch % 90 + 1
            }
        }
        let received = try await collect(count, from: connection, seconds: 120)
        try await sender.value
        #expect(received.count == count)
        for (index, message) in received.enumerated() {
            #expect(message.msgid == 7 && message.payload == payloads[index], "message \(index)")
        }
        #expect(connection.invalidationReason == nil)
    }

    @Test("frames on either side of the coalescing limit arrive whole, alone, batched and as requests, every framing", arguments: Framing.allCases)
    func coalescingLimit(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("coalescing")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        let connection = try await UnixSocketTransport(framing: framing).connect(to: endpoint, options: .defaults)
        defer { connection.invalidate() }
        // A frame up to the limit is written from one contiguous copy, a larger one as header and
        // payload segments; a batch too, by its total. These sizes put binary frames at the limit
        // less one, at it and above it (an HTTP head is longer, so its frames cross it lower).
        let limit = UnixSocketChannel.coalescedFrameLimit
        let header = 20
        let sizes = [0, 1, limit - header - 1, limit - header, limit - header + 1, limit]
        func payload(_ size: Int, _ seed: Int) -> [UInt8] {
            periodicBytes(size, step: 31, offset: seed)
        }
        var expected: [[UInt8]] = []
        for (index, size) in sizes.enumerated() {
            let message = payload(size, index)
            try await connection.send(message, msgid: 3, timeout: .seconds(60))
            expected.append(message)
        }
        // Eight tiny messages: one copy in every framing (an HTTP head is under 200 bytes).
        let tiny = (0..<8).map { payload(16, 50 + $0) }
        try await connection.send(contentsOf: tiny, msgid: 3, timeout: .seconds(60))
        expected += tiny
        // Batches of eight whose totals are just under, at and just over the limit.
        let per = limit / 8 - header
        for (index, extra) in [-1, 0, 1].enumerated() {
            var batch = (0..<8).map { payload(per, 100 + 8 * index + $0) }
            batch[7] = payload(per + (limit - 8 * (per + header)) + extra, 200 + index)
            try await connection.send(contentsOf: batch, msgid: 3, timeout: .seconds(60))
            expected += batch
        }
        let received = try await collect(expected.count, from: connection, seconds: 120)
        #expect(received.count == expected.count)
        for (index, message) in received.enumerated() where index < expected.count {
            #expect(message.msgid == 3 && message.payload == expected[index], "message \(index) of \(expected[index].count) bytes")
        }
        // Requests, and their replies, on both sides of the limit.
        for (index, size) in sizes.enumerated() {
            let request = payload(size, 300 + index)
            let reply = try await connection.request(request, msgid: PeerRequest.echo, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
            #expect(reply == request, "request of \(size) bytes")
        }
        #expect(connection.invalidationReason == nil)
    }

    /// With the smallest send buffer the kernel allows, a frame of a few KiB goes in pieces, so a
    /// write begun as one copy can stop inside it; the channel is then asked for the rest from
    /// that byte, as the engine asks (header and payload segments). What the other end reads,
    /// decoded, must be every frame whole and in order.
    @Test("a frame begun as one copy and stopped by a full socket goes on from the byte it stopped at, every framing", arguments: Framing.allCases)
    func coalescedFrameContinued(framing: Framing) throws {
        var descriptors: [CInt] = [-1, -1]
        try #require(socketpair(AF_UNIX, CInt(SOCK_STREAM.rawValue) | CInt(SOCK_CLOEXEC.rawValue), 0, &descriptors) == 0)
        let reader = descriptors[1]
        defer { close(reader) }
        var smallest: CInt = 1
        try #require(setsockopt(descriptors[0], SOL_SOCKET, SO_SNDBUF, &smallest, socklen_t(MemoryLayout<CInt>.size)) == 0)
        let channel = UnixSocketChannel(fd: FileDescriptor(rawValue: descriptors[0]), framing: framing, maximumPayloadLength: 1 << 20)
        defer { channel.close() }
        let limit = UnixSocketChannel.coalescedFrameLimit
        let frames = (0..<64).map { index in
            Frame(kind: .message, msgid: 9, payload: periodicBytes(limit - 300 - index, step: 7, offset: index))
        }
        var received: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1_000)
        /// Reads what the socket has, at most `limit` bytes; the count.
        func drain(atMost limit: Int) -> Int {
            let count = chunk.withUnsafeMutableBytes { recv(reader, $0.baseAddress, min(limit, $0.count), CInt(MSG_DONTWAIT)) }
            if count > 0 { received += chunk[..<count] }
            return max(count, 0)
        }
        var stoppedInside = 0
        var total = 0
        for frame in frames {
            let length = try channel.encodedLength(of: frame)
            #expect(length <= limit, "a \(framing) frame of \(length) bytes is not written as one copy")
            total += length
            var written = 0
            var attempts = 0
            while written < length {
                let wrote = try channel.write(frame, from: written)
                // A write of the whole frame (begun as one copy) that the kernel stopped inside it.
                if written == 0, wrote > 0, wrote < length { stoppedInside += 1 }
                written += wrote
                if written < length { _ = drain(atMost: 700) }
                attempts += 1
                try #require(attempts < 10_000, "the socket took nothing more of a frame")
            }
        }
        while received.count < total, drain(atMost: 1_000) > 0 {}
        #expect(received.count == total)
        #expect(stoppedInside > 0, "no write stopped inside a frame: the continuation was not exercised")
        let reassembler = framing.makeReassembler(maximumPayloadLength: 1 << 20)
        var offset = 0
        while offset < received.count {
            offset += reassembler.receive { buffer in
                let count = min(buffer.count, received.count - offset)
                received.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + count)])) }
                return count
            }
        }
        var decoded: [Frame] = []
        while let frame = try reassembler.nextFrame() { decoded.append(frame) }
        #expect(decoded.count == frames.count)
        #expect(decoded.map(\.payload) == frames.map(\.payload))
        #expect(decoded.allSatisfy { $0.msgid == 9 && $0.kind == .message })
    }
}
