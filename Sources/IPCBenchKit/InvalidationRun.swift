import Foundation
import IPCCore
import IPCEngine
import IPCFraming
import IPCSystem

/// Time from SIGKILL of a peer process to the survivor's invalidation handler, per transport.
public struct InvalidationResult: Codable, Sendable {
    public var transport: String
    /// Each trial's time from `kill(2)` returning to the handler starting, in nanoseconds.
    public var trials: [UInt64]

    public var median: UInt64 { LatencyResult.median(trials) }
    public var maximum: UInt64 { trials.max() ?? 0 }
}

public struct InvalidationRunner: Sendable {
    public var transports: [String]
    public var trials: Int
    public var progress: ProgressReporter

    public init(transports: [String], trials: Int = 7, progress: ProgressReporter) {
        self.transports = transports
        self.trials = trials
        self.progress = progress
    }

    /// Kills a fresh server peer `trials` times per transport and times the client's invalidation.
    /// - Throws: ``IPCError/Code/receiveTimeout`` if invalidation does not come within 10 s.
    public func run() async throws -> [InvalidationResult] {
        let group = try TemporaryGroup()
        defer { group.remove() }
        var results: [InvalidationResult] = []
        for (index, name) in transports.enumerated() {
            progress.begin(step: index + 1, of: transports.count, label: "invalidation after SIGKILL: \(name)")
            let transport = try TransportCatalog.transport(named: name, framing: .binary)
            var times: [UInt64] = []
            for trial in 0..<trials {
                let endpoint = try Endpoint(group: group.directory, name: "\(group.directory.identifier).kill-\(name)-\(trial)")
                times.append(try await killAndTime(transport, endpoint: endpoint, name: name))
            }
            let result = InvalidationResult(transport: name, trials: times)
            progress.end(label: name, summary: "median \(formatMicroseconds(result.median)), max \(formatMicroseconds(result.maximum))")
            results.append(result)
        }
        return results
    }

    private func killAndTime<T: MessageTransport>(_ transport: T, endpoint: Endpoint, name: String) async throws -> UInt64 {
        let peer = try PeerProcess(transport: name, framing: .binary, endpoint: endpoint, role: .server)
        let connection = try await transport.connect(to: endpoint, options: .defaults)
        let invalidatedAt = LockedBox<UInt64?>(nil)
        let done = DispatchSemaphore(value: 0)
        connection.setInvalidationHandler { _ in
            invalidatedAt.value = monotonicNanoseconds()
            done.signal()
        }
        let killedAt = monotonicNanoseconds()
        peer.kill()
        let signalled = await withCheckedContinuation { continuation in
            Thread.detachNewThread { continuation.resume(returning: done.wait(timeout: .now() + 10) == .success) }
        }
        peer.waitForExit()
        guard signalled, let at = invalidatedAt.value else {
            connection.invalidate()
            throw IPCError(code: .receiveTimeout, message: "\(name): no invalidation within 10 s of SIGKILL")
        }
        return at - killedAt
    }
}
