import Foundation
import IPCBenchKit
import IPCCore
import IPCTestSupport
import Testing

/// Hostile peers are `ipcbench hostile ...`: real second processes that write what no
/// well-behaved peer would, below the transports.
enum HostilePeer {
    /// Connects to the socket at `path` and writes `bytes` (see `ipcbench hostile socket`).
    /// Returns once the process is connected.
    static func socket(
        path: String,
        bytes: [UInt8],
        repeatCount: Int = 1,
        chunk: Int = 0,
        pauseMicroseconds: Int = 0,
        then ending: String = "stall",
        timeout: Int = 60
    ) async throws -> PeerProcess {
        let input = try temporaryFile(bytes)
        return try await runBlocking { try PeerProcess(arguments: [
            "hostile", "socket", "--path", path, "--input", input, "--repeat-count", String(repeatCount),
            "--chunk", String(chunk), "--pause-microseconds", String(pauseMicroseconds), "--then", ending, "--timeout", String(timeout),
        ]) }
    }

    /// Runs `ipcbench hostile <arguments>` to completion and returns its exit status.
    @discardableResult
    static func run(_ arguments: [String]) throws -> Int32 {
        try PeerProcess.runToCompletionSynchronously(["hostile"] + arguments).status
    }

    /// Writes `changes` (offset → bytes) into `file` from another process, then posts the futex
    /// words at `post`.
    static func write(into file: String, _ changes: [(offset: Int, bytes: [UInt8])], post: [Int] = []) throws {
        var arguments = ["write", "--file", file]
        for (offset, bytes) in changes where !bytes.isEmpty { arguments += ["--at", "\(offset):\(hex(bytes))"] }
        for offset in post { arguments += ["--post", String(offset)] }
        let status = try run(arguments)
        #expect(status == 0, "ipcbench hostile write exited with \(status)")
    }

    static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    private static func temporaryFile(_ bytes: [UInt8]) throws -> String {
        let path = inputDirectory + "/" + UUID().uuidString
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// One directory per test process for the hostile peers' inputs (a peer reads its input
    /// whenever it gets to it, so no test knows when to remove one), removed when the process exits.
    private static let inputDirectory: String = {
        let path = NSTemporaryDirectory() + "ipcbench-hostile-inputs-\(getpid())-\(UUID().uuidString.prefix(8))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        // Runs after this initializer has finished, so it reads the path, not the initializer.
        atexit { _ = try? FileManager.default.removeItem(atPath: HostilePeer.inputDirectory) }
        return path
    }()
}

/// Waits for the hostile process to exit and checks that it was dropped (status 0: the
/// listener closed its connection).
func expectDropped(_ peer: PeerProcess, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    let status = try await withDeadline(seconds: 90, "the hostile peer (\(what)) being dropped") { peer.waitForExit() }
    #expect(status == 0, "the hostile peer (\(what)) was not dropped (status \(status))", sourceLocation: sourceLocation)
}

/// The next connection of `stream` whose peer is `pid` (others are left alone).
func nextConnection<C: MessageConnection>(from stream: AsyncStream<C>, peer pid: Int32, _ what: String) async throws -> C {
    try await withDeadline(seconds: 30, "accepting \(what)") {
        for await connection in stream where connection.peer?.pid == pid { return connection }
        throw IPCError(code: .endpointNotFound, message: "the listener closed before \(what) connected")
    }
}

/// Resident and virtual memory of a process, in bytes, from `/proc/<pid>/status`.
func memoryUsage(of pid: Int32) throws -> (resident: Int, virtual: Int, peakResident: Int) {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    func field(_ name: String) -> Int {
        let line = status.split(separator: "\n").first { $0.hasPrefix(name + ":") } ?? ""
        return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
    }
    return (field("VmRSS"), field("VmSize"), field("VmHWM"))
}

/// Round trips to a well-behaved peer, over and over, until stopped: the proof that a listener
/// keeps serving while a hostile peer works on it.
final class RoundTripLoop: Sendable {
    private let stopped = LockedValue(false)
    private let task: Task<(succeeded: Int, failures: [String]), Never>

    init(_ connection: some MessageConnection, msgid: UInt32) {
        let stopped = stopped
        task = Task {
            var succeeded = 0
            var failures: [String] = []
            while !stopped.get() {
                let payload = Array("round trip \(succeeded)".utf8)
                do {
                    let reply = try await connection.request(payload, msgid: msgid, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
                    if reply == payload { succeeded += 1 } else { failures.append("round trip \(succeeded) echoed \(reply.count) other bytes") }
                } catch {
                    failures.append("round trip \(succeeded): \(error)")
                    break
                }
                try? await Task.sleep(for: .milliseconds(5))
            }
            return (succeeded, failures)
        }
    }

    /// Stops the loop and checks that every round trip succeeded, and that there were some.
    func stop(sourceLocation: SourceLocation = #_sourceLocation) async {
        stopped.set(true)
        let (succeeded, failures) = await task.value
        #expect(failures.isEmpty, "the well-behaved peer was not served: \(failures)", sourceLocation: sourceLocation)
        #expect(succeeded > 0, "no round trip with the well-behaved peer completed", sourceLocation: sourceLocation)
    }
}
