import Foundation
@testable import IPCBenchKit
import IPCSystem
import Testing

/// What a harness killed with SIGKILL leaves behind is reclaimed by the next run, and nothing of
/// a run that is still alive is touched.
@Suite("Harness: abandoned run directories", .serialized)
struct TemporaryGroupTests {
    private func makeRunDirectory(in parent: String) throws -> String {
        let path = parent + "/" + TemporaryGroup.prefix + UUID().uuidString.prefix(6)
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        #expect(FileManager.default.createFile(atPath: path + "/" + TemporaryGroup.lockName, contents: nil))
        return path
    }

    private func queues(of path: String) -> [String] {
        let identifier = (path as NSString).lastPathComponent
        return [
            "/ipcb.0123456789abcdef.\(identifier).port",  // a message port of that group
            "/ipcb.0123456789abcdef.\(identifier).port.r4242.1",  // a client's reply queue
            "/\(identifier).floor-4242.request",  // the mqueue floor's
        ]
    }

    @Test("a run directory whose lock nobody holds is removed with its queues; a live run's stays", .enabled(if: FileManager.default.fileExists(atPath: "/dev/mqueue/.")))
    func reclaimsOnlyDeadRuns() throws {
        let parent = NSTemporaryDirectory() + "ipcbench-reclaim-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: parent) }
        let dead = try makeRunDirectory(in: parent)
        let live = try makeRunDirectory(in: parent)
        // A directory from before the lock existed: nothing says its run is over.
        let unmarked = parent + "/" + TemporaryGroup.prefix + "old"
        try FileManager.default.createDirectory(atPath: unmarked, withIntermediateDirectories: false)
        for name in queues(of: dead) + queues(of: live) {
            try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64).close()
        }
        defer { for name in queues(of: live) { MessageQueue.unlink(name: name) } }
        // The live run is another process holding its lock (util-linux flock(1)), until its
        // standard input closes.
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
        holder.arguments = ["--exclusive", live + "/" + TemporaryGroup.lockName, "cat"]
        let input = Pipe()
        holder.standardInput = input
        holder.standardOutput = FileHandle.nullDevice
        try holder.run()
        defer {
            try? input.fileHandleForWriting.close()
            holder.waitUntilExit()
        }
        // Give flock(1) time to take the lock: poll until a non-blocking attempt fails.
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            let descriptor = open(live + "/" + TemporaryGroup.lockName, O_RDWR)
            defer { close(descriptor) }
            if flock(descriptor, LOCK_EX | LOCK_NB) != 0 { break }
            flock(descriptor, LOCK_UN)
            usleep(10_000)
        }

        let removed = TemporaryGroup.reclaimAbandoned(in: parent)
        #expect(removed == [dead])
        #expect(!FileManager.default.fileExists(atPath: dead))
        for name in queues(of: dead) { #expect(!MessageQueue.exists(name: name), "\(name) was left") }
        #expect(FileManager.default.fileExists(atPath: live))
        for name in queues(of: live) { #expect(MessageQueue.exists(name: name), "\(name) of a live run was removed") }
        #expect(FileManager.default.fileExists(atPath: unmarked))
    }
}
