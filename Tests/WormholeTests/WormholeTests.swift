import Foundation
import Glibc
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCSecureCoding
import IPCTestSupport
import NotifyTransport
import Synchronization
import Testing
import Wormhole

/// MMWormhole's mailbox against a second process (`ipcbench wormhole`), and against what a
/// same-user process can leave in the group directory.
@Suite("Wormhole")
struct WormholeTests {
    private func wormhole(_ group: borrowing TestGroup) throws -> Wormhole<NotifyCenter> {
        try Wormhole(group: group.directory, center: NotifyCenter(group: group.directory))
    }

    private func tool(_ group: borrowing TestGroup, _ arguments: [String]) throws -> (status: Int32, output: String) {
        try PeerProcess.runToCompletionSynchronously(["wormhole", "--group", group.directory.path] + arguments)
    }

    @Test("objects pass through the secure codecs: read back as their type, refused when their type is not allowed, a garbage message from another process a typed error; the bytes stay")
    func objects() throws {
        let group = try TestGroup()
        let wormhole = try wormhole(group)
        let order = Order(
            id: 7, customer: "wormhole", items: [Order.LineItem(sku: "A-1", quantity: 2, unitPriceCents: 250)], tags: ["x"],
            placedAt: Date(timeIntervalSince1970: 1_700_000_000), attachment: Data([1, 2, 3])
        )
        for codec in [BinaryCodablePayloadCodec() as any PayloadCodec, JSONPayloadCodec()] {
            try wormhole.passMessageObject(order, identifier: "order", codec: codec)
            #expect(try wormhole.messageObject(Order.self, withIdentifier: "order", codec: codec) == order)
            let any = try #require(try wormhole.messageObject(withIdentifier: "order", allowing: AllowList([Order.self]), codec: codec))
            #expect(any as? Order == order)
            // Nothing allowed: refused, and the stored message is untouched.
            let stored = try wormhole.message(withIdentifier: "order")
            do {
                _ = try wormhole.messageObject(withIdentifier: "order", allowing: AllowList(), codec: codec)
                Issue.record("an order decoded with nothing allowed (\(codec.name))")
            } catch let error as IPCError {
                #expect(error.code == .disallowedType, "\(error)")
            }
            #expect(try wormhole.message(withIdentifier: "order") == stored)
        }
        #expect(try wormhole.messageObject(Order.self, withIdentifier: "never-passed") == nil)
        // Another process stores bytes that are no object at all.
        #expect(try tool(group, ["--pass", "order=not an object"]).status == 0)
        do {
            _ = try wormhole.messageObject(Order.self, withIdentifier: "order")
            Issue.record("garbage decoded as an order")
        } catch let error as IPCError {
            #expect(error.code == .malformedPayload, "\(error)")
        }
        #expect(try wormhole.message(withIdentifier: "order") == Array("not an object".utf8))
    }

    @Test("a message passed by a process that has exited is read later by one that was not running; clear removes it")
    func storedMessagesOutliveTheSender() throws {
        let group = try TestGroup()
        #expect(try tool(group, ["--pass", "status=ready to go", "--pass", "other=x"]).status == 0)
        // The sender has exited; this process opens the wormhole only now.
        let wormhole = try wormhole(group)
        #expect(try wormhole.message(withIdentifier: "status") == Array("ready to go".utf8))
        try wormhole.passMessage(Array("replaced".utf8), identifier: "status")
        #expect(try tool(group, ["--read", "status"]).output == "replaced\n")
        try wormhole.clearMessageContents(forIdentifier: "status")
        #expect(try wormhole.message(withIdentifier: "status") == nil)
        #expect(try tool(group, ["--read", "status", "--read", "other"]).output == "(none)\nx\n")
        #expect(try tool(group, ["--clear-all"]).status == 0)
        #expect(try wormhole.message(withIdentifier: "other") == nil)
        try wormhole.clearMessageContents(forIdentifier: "never-passed")
    }

    @Test("a listener is told of messages passed by another process, each one when they do not coalesce; stopListening ends it")
    func listening() async throws {
        let group = try TestGroup()
        let wormhole = try wormhole(group)
        let messages = try wormhole.listen(forIdentifier: "progress")
        let received = Mutex<[String]>([])
        let reader = Task {
            for await message in messages {
                received.withLock { $0.append(String(decoding: message, as: UTF8.self)) }
            }
        }
        for step in 1...3 {
            #expect(try tool(group, ["--pass", "progress=step \(step)"]).status == 0)
            try await withDeadline(seconds: 30, "message \(step)") {
                while received.withLock({ $0.count }) < step { try await Task.sleep(for: .milliseconds(10)) }
            }
        }
        #expect(received.withLock { $0 } == ["step 1", "step 2", "step 3"])
        wormhole.stopListening(forIdentifier: "progress")
        try await withDeadline(seconds: 30, "the listener to end") { await reader.value }
    }

    @Test("another process listening is told of a message passed here")
    func listenerInAnotherProcess() async throws {
        let group = try TestGroup()
        let listener = Process()
        listener.executableURL = try PeerProcess.executableURL()
        listener.arguments = ["wormhole", "--group", group.directory.path, "--listen", "news", "--count", "1", "--timeout", "30"]
        let output = try ChildProcess.run(listener, output: true).output!
        var seen = Data()
        while !String(decoding: seen, as: UTF8.self).contains("READY"), let chunk = try output.read(upToCount: 1), !chunk.isEmpty {
            seen += chunk
        }
        try wormhole(group).passMessage(Array("hello over there".utf8), identifier: "news")
        listener.waitUntilExit()
        seen += output.readDataToEndOfFile()
        #expect(listener.terminationStatus == 0)
        #expect(String(decoding: seen, as: UTF8.self).contains("hello over there"))
    }

    @Test("a reader never sees a torn message while another process replaces it 300 times")
    func neverTorn() async throws {
        let group = try TestGroup()
        let wormhole = try wormhole(group)
        let writer = Process()
        writer.executableURL = try PeerProcess.executableURL()
        writer.arguments = ["wormhole", "--group", group.directory.path, "--pass-pattern", "big", "--size", "262144", "--count", "300"]
        try writer.run()
        var reads = 0
        while writer.isRunning || reads == 0 {
            if let message = try wormhole.message(withIdentifier: "big") {
                #expect(message.count == 262_144)
                #expect(message.allSatisfy { $0 == message[0] }, "a message mixes bytes of two writes")
                reads += 1
            }
        }
        writer.waitUntilExit()
        #expect(writer.terminationStatus == 0)
        #expect(try wormhole.message(withIdentifier: "big")?.first == UInt8(299 % 251))
    }

    @Test("what another process of the user leaves in the directory is refused with a typed error, never a crash")
    func hostileFiles() throws {
        let group = try TestGroup()
        let wormhole = try wormhole(group)
        try wormhole.passMessage(Array(repeating: 7, count: 100), identifier: "good")
        let directory = wormhole.directory
        let good = try Data(contentsOf: URL(fileURLWithPath: directory + "/good.message"))
        func plant(_ name: String, _ bytes: Data) throws {
            try bytes.write(to: URL(fileURLWithPath: directory + "/\(name).message"))
        }
        var flipped = good
        flipped[40] ^= 0xFF
        try plant("flipped", flipped)
        try plant("truncated", good.prefix(60))
        try plant("empty", Data())
        var huge = good
        huge.replaceSubrange(8..<16, with: withUnsafeBytes(of: UInt64.max.bigEndian) { Data($0) })
        try plant("huge", huge)
        var longer = good
        longer.replaceSubrange(8..<16, with: withUnsafeBytes(of: UInt64(101).bigEndian) { Data($0) })
        try plant("longer", longer)
        try plant("garbage", Data("not a wormhole message at all".utf8))
        #expect(symlink(directory + "/good.message", directory + "/link.message") == 0)
        #expect(mkfifo(directory + "/fifo.message", 0o600) == 0)
        let expectations: [(String, IPCError.Code)] = [
            ("flipped", .malformedPayload), ("truncated", .malformedPayload), ("empty", .malformedPayload), ("huge", .frameTooLarge),
            ("longer", .malformedPayload), ("garbage", .malformedPayload), ("link", .invalidEndpoint), ("fifo", .invalidEndpoint),
        ]
        for (identifier, code) in expectations {
            #expect(throws: IPCError.self, "\(identifier)") {
                do { _ = try wormhole.message(withIdentifier: identifier) } catch let error as IPCError {
                    #expect(error.code == code, "\(identifier): \(error)")
                    throw error
                }
            }
        }
        // The good message is still read, and bad identifiers are refused before any file is touched.
        #expect(try wormhole.message(withIdentifier: "good") == Array(repeating: 7, count: 100))
        for bad in ["", "../escape", ".hidden", "a/b", String(repeating: "x", count: 65)] {
            #expect(throws: IPCError.self) { try wormhole.passMessage([1], identifier: bad) }
        }
        #expect(throws: IPCError.self) { try wormhole.passMessage([UInt8](repeating: 0, count: wormhole.maximumMessageLength + 1), identifier: "toolarge") }
        try wormhole.clearAllMessageContents()
        #expect(try wormhole.message(withIdentifier: "good") == nil)
    }
}
