public import Foundation
public import IPCConformance
public import IPCCore
public import IPCFraming
import Synchronization

/// A peer started as a separate process: the `ipcbench` executable in peer mode.
///
/// The peer's standard input is a pipe from this process, so the peer exits when this process
/// does, even if this process is killed.
public final class PeerProcess: Sendable {
    public let pid: Int32
    /// The process, its pipes and its announcement, as the conformance kit runs every peer.
    private let peer: ExecutablePeer

    /// Where the `ipcbench` executable is: next to the running executable (or test bundle),
    /// unless `IPCBENCH_EXECUTABLE` names it.
    public static func executableURL() throws -> URL {
        if let path = ProcessInfo.processInfo.environment["IPCBENCH_EXECUTABLE"] {
            return URL(fileURLWithPath: path)
        }
        let selfPath = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        var directory = URL(fileURLWithPath: selfPath).deletingLastPathComponent()
        if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
        let candidate = directory.appendingPathComponent("ipcbench")
        guard FileManager.default.isExecutableFile(atPath: candidate.path) else {
            throw IPCError(code: .endpointNotFound, message: "no ipcbench executable at \(candidate.path); build it or set IPCBENCH_EXECUTABLE")
        }
        return candidate
    }

    /// Runs `ipcbench` with `arguments` to completion and returns its exit status and standard
    /// output. It waits on a thread of its own, never on one of the few threads of Swift's
    /// cooperative pool (two on a two-core machine), which other tasks need meanwhile.
    public static func runToCompletion(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                continuation.resume(with: Result { try runToCompletionSynchronously(arguments) })
            }
        }
    }

    /// ``runToCompletion(_:)`` waiting on the calling thread: for commands that end at once
    /// (a `notifyutil` post), or callers on threads of their own.
    public static func runToCompletionSynchronously(_ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = try executableURL()
        process.arguments = arguments
        let output = try ChildProcess.run(process, output: true).output!
        let data = output.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// Starts a peer and waits until it is listening or connected.
    /// - Throws: ``IPCError/Code/transportFailure`` if it exits or says nothing within `timeout`;
    ///   ``IPCError/Code/unsupportedOperation`` for the coordinator role (``CoordinationPeerProcess``).
    public convenience init(
        transport: String,
        framing: Framing,
        endpoint: Endpoint,
        role: PeerRole,
        cpu: Int? = nil,
        burst: (count: Int, size: Int)? = nil,
        waitStrategy: WaitStrategy = .blocking,
        stalledFrameTimeout: Duration? = ConnectionOptions.defaults.stalledFrameTimeout,
        serving: ConformancePeer.Serving = .task,
        timeout: Duration = .seconds(20)
    ) throws {
        // The peer's own options are the conformance peer's, written by the one place that writes them.
        guard let peerRole = ConformancePeer.Role(rawValue: role.rawValue) else {
            throw IPCError(code: .unsupportedOperation, message: "a \(role.rawValue) peer is not started this way")
        }
        let configuration = ConformancePeer.Configuration(
            endpoint: endpoint, role: peerRole, burstCount: burst?.count ?? 0, burstSize: burst?.size ?? 4,
            waitStrategy: waitStrategy, stalledFrameTimeout: stalledFrameTimeout, serving: serving
        )
        var arguments = ["peer", "--transport", transport, "--framing", framing.rawValue] + configuration.arguments
        if let cpu { arguments += ["--cpu", String(cpu)] }
        try self.init(arguments: arguments, timeout: timeout)
    }

    /// Starts `ipcbench` with `arguments`, a subcommand that prints `READY <pid>` once it serves
    /// (`peer`, `floor-peer`), and waits for that line.
    /// - Throws: ``IPCError/Code/transportFailure`` if it exits or says nothing within `timeout`.
    public init(arguments: [String], timeout: Duration = .seconds(20)) throws {
        peer = try ExecutablePeer(executable: try Self.executableURL(), arguments: arguments)
        pid = peer.pid
        _ = try peer.waitUntilReady(timeout: timeout)
    }

    /// Kills the peer with SIGKILL, as a crash or the OOM killer would.
    public func kill() {
        peer.kill()
    }

    /// Asks the peer to finish (closes its standard input) and waits for it to exit.
    public func stop() {
        peer.stop()
    }

    /// Asks the peer to finish and returns what it wrote on standard output after `READY`.
    public func stopReadingOutput() -> String {
        peer.stopReadingOutput()
    }

    /// Waits for the process to exit and returns its termination status.
    @discardableResult
    public func waitForExit() -> Int32 {
        peer.waitForExit()
    }

    public var isRunning: Bool { peer.isRunning }
}

/// A value shared between threads under a lock.
final class LockedBox<Value: Sendable>: Sendable {
    private let stored: Mutex<Value>

    init(_ value: Value) { stored = Mutex(value) }

    var value: Value {
        get { stored.withLock { $0 } }
        set { stored.withLock { $0 = newValue } }
    }
}
