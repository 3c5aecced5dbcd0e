import Foundation
import IPCBenchKit
import IPCSystem
import Testing

/// `ipcbench clean`: the queues a killed run left are removed; a queue a live process holds is not.
@Suite("ipcbench clean")
struct CleanCommandTests {
    @Test("removes this user's abandoned ipcbench queues, lists them first with --dry-run, and leaves a held one alone")
    func removesAbandonedQueuesOnly() async throws {
        try #require(FileManager.default.fileExists(atPath: "/dev/mqueue"), "/dev/mqueue is not mounted (Scripts/test.sh mounts it)")
        let tag = String(UInt64.random(in: 1...UInt64.max), radix: 36)
        // Left behind: made and closed, as by a process killed before it removed it.
        let abandoned = try MessageQueue.create(name: "/ipcb.clean-test-\(tag)-left", maximumMessages: 1, messageSize: 64)
        abandoned.close()
        // Held open by this (live) process.
        let held = try MessageQueue.create(name: "/ipcb.clean-test-\(tag)-held", maximumMessages: 1, messageSize: 64)
        defer {
            held.close()
            MessageQueue.unlink(name: held.name)
        }
        let left = "/dev/mqueue/ipcb.clean-test-\(tag)-left"
        let kept = "/dev/mqueue/ipcb.clean-test-\(tag)-held"
        defer { MessageQueue.unlink(name: "/ipcb.clean-test-\(tag)-left") }
        #expect(FileManager.default.fileExists(atPath: left))

        let (dryStatus, dryOutput) = try await PeerProcess.runToCompletion(["clean", "--dry-run"])
        #expect(dryStatus == 0)
        #expect(dryOutput.contains("would remove /ipcb.clean-test-\(tag)-left"), "\(dryOutput)")
        #expect(!dryOutput.contains("clean-test-\(tag)-held"), "\(dryOutput)")
        #expect(FileManager.default.fileExists(atPath: left), "--dry-run removed a queue")

        let (status, output) = try await PeerProcess.runToCompletion(["clean"])
        #expect(status == 0)
        #expect(output.contains("removed /ipcb.clean-test-\(tag)-left"), "\(output)")
        #expect(!FileManager.default.fileExists(atPath: left))
        #expect(FileManager.default.fileExists(atPath: kept), "a queue a live process holds was removed")
    }
}
