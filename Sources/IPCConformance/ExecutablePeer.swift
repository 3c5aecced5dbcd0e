public import Foundation
import IPCCore
import Synchronization

/// Starts peers by running an executable with ``ConformancePeer/Configuration/arguments``
/// after a fixed list of leading arguments (for example `["peer", "--transport", "toy"]`).
public struct ExecutablePeerLauncher: ConformancePeerLauncher {
    public var executable: URL
    public var leadingArguments: [String]

    public init(executable: URL, leadingArguments: [String] = []) {
        self.executable = executable
        self.leadingArguments = leadingArguments
    }

    /// - Throws: what `Process.run()` throws when the executable cannot be started.
    public func launch(_ configuration: ConformancePeer.Configuration) throws -> any ConformancePeerProcess {
        try ExecutablePeer(executable: executable, arguments: leadingArguments + configuration.arguments)
    }
}

/// A peer process: standard input is a pipe from this process (closing it asks the peer to
/// finish, and this process's death closes it too), standard output carries the announcement.
public final class ExecutablePeer: ConformancePeerProcess {
    public let pid: Int32
    private let process: Process
    /// This side's end of the peer's standard input, and of its standard output.
    private let input: FileHandle
    private let output: FileHandle
    private let state = Mutex<(announcement: ConformancePeer.Announcement?, stopped: Bool)>((nil, false))

    /// Starts `executable` with `arguments`.
    /// - Throws: what `Process.run()` throws.
    public init(executable: URL, arguments: [String]) throws {
        (process, input, output) = try ChildProcess.start(executable, arguments: arguments)
        pid = process.processIdentifier
    }

    /// - Throws: ``IPCError/Code/transportFailure`` if the peer exits, or says anything but an
    ///   announcement, or nothing within `timeout`; the peer is then killed.
    public func waitUntilReady(timeout: Duration) throws -> ConformancePeer.Announcement {
        if let announcement = state.withLock({ $0.announcement }) { return announcement }
        let line = readFirstLine(timeout: timeout)
        guard let line, let announcement = ConformancePeer.Announcement(line: line) else {
            kill()
            throw IPCError(code: .transportFailure, message: "peer process \(pid) did not become ready (said \(line.debugDescription))")
        }
        state.withLock { $0.announcement = announcement }
        return announcement
    }

    /// The first line of standard output, read on a helper thread so a silent peer cannot hang
    /// the caller; `nil` on timeout.
    private func readFirstLine(timeout: Duration) -> String? {
        let line = Mutex<String?>(nil)
        let done = DispatchSemaphore(value: 0)
        let handle = output
        Thread.detachNewThread {
            var bytes: [UInt8] = []
            while let chunk = try? handle.read(upToCount: 1), let byte = chunk.first, byte != UInt8(ascii: "\n") {
                bytes.append(byte)
            }
            line.withLock { $0 = String(decoding: bytes, as: UTF8.self) }
            done.signal()
        }
        guard done.wait(timeout: .now() + timeout.seconds) == .success else { return nil }
        return line.withLock { $0 }
    }

    public func kill() {
        _ = Foundation.kill(pid, SIGKILL)
    }

    public func stop() {
        let first = state.withLock { state in
            defer { state.stopped = true }
            return !state.stopped
        }
        guard first else { return }
        try? input.close()
        process.waitUntilExit()
    }

    /// Asks the peer to finish (closes its standard input), and returns what it writes on
    /// standard output after its announcement until it exits. For a peer that reports at the end
    /// (`ipcbench load`); the report must be short enough for a pipe's buffer.
    public func stopReadingOutput() -> String {
        state.withLock { $0.stopped = true }
        try? input.close()
        let data = (try? output.readToEnd()) ?? nil
        process.waitUntilExit()
        return String(decoding: data ?? Data(), as: UTF8.self)
    }

    /// Waits for the process to exit and returns its termination status.
    @discardableResult
    public func waitForExit() -> Int32 {
        process.waitUntilExit()
        return process.terminationStatus
    }

    public var isRunning: Bool { process.isRunning }
}

extension Duration {
    /// The duration in seconds, for APIs that take a `Double`.
    var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
