import Foundation
import IPCBenchKit
import IPCCore
import IPCEngine
import IPCFraming
import IPCTestSupport
import Testing
import UnixSocketTransport

/// The batched send over a real socket (the unix-socket channel's gathering `sendmsg`), against
/// a peer process that echoes one-way messages.
@Suite("Unix socket: batched sends")
struct UnixSocketBatchedSendTests {
    @Test("batched one-way messages arrive in order, once each, whole across gathered writes, both framings", arguments: Framing.allCases)
    func batchedDelivery(framing: Framing) async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("batched")
        let peer = try PeerProcess(transport: "unix-socket", framing: framing, endpoint: endpoint, role: .server)
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
}
