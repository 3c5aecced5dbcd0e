import Foundation
import IPCCore
import IPCEngine
import IPCFraming
import IPCSystem

/// Time from SIGKILL of a peer process to the survivor's invalidation handler, per transport;
/// for a reference system (``ReferenceSystem``), to its client's exit with the error it noticed.
public struct InvalidationResult: Codable, Sendable {
    public var transport: String
    /// Each trial's time from `kill(2)` returning to the handler starting, in nanoseconds.
    public var trials: [UInt64]
    /// `true` for a reference system's row.
    public var reference: Bool? = nil
    /// `false` when the survivor did not notice the death: the trial's time is when it gave up
    /// on its own (a reference's client, at its 10 s no-progress deadline). `nil`: noticed.
    public var detected: Bool? = nil
    /// What the survivor said it noticed (a reference client's error line), or why it did not.
    public var outcome: String? = nil

    public init(transport: String, trials: [UInt64], reference: Bool? = nil, detected: Bool? = nil, outcome: String? = nil) {
        self.transport = transport
        self.trials = trials
        self.reference = reference
        self.detected = detected
        self.outcome = outcome
    }

    /// Whether the survivor noticed the death (always, for a transport's row).
    public var noticed: Bool { detected ?? true }

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

/// "When a peer dies" for the reference systems (blocking ones: a spinning variant of a system
/// dies the same way, and its server's context switches cannot show that it serves): each
/// system's server is SIGKILLed while a
/// client is in a loop of round trips, and the time until that client exits with the error it
/// noticed is taken (``ReferenceSession/killDuringRoundTrips(settle:)``). A client that notices
/// nothing gives up at its own 10 s deadline: such a system is tried once and reported as not
/// detecting the death.
public struct ReferencePeerDeathRunner: Sendable {
    public var references: [ReferenceSystem]
    public var trials: Int
    public var progress: ProgressReporter

    public init(references: [ReferenceSystem], trials: Int = 3, progress: ProgressReporter) {
        self.references = references
        self.trials = trials
        self.progress = progress
    }

    /// Starts a server off the cooperative pool, trying again for up to 5 s: a killed
    /// predecessor's daemon may still be on its way out (one RouDi per machine).
    private static func start(_ reference: ReferenceSystem, in directory: URL, instance: String) async throws -> ReferenceSession {
        try await runBlocking {
            let deadline = Date().addingTimeInterval(5)
            var attempt = 0
            while true {
                do {
                    return try ReferenceSession(reference, placement: .unpinned, group: directory, instance: instance + (attempt == 0 ? "" : "-\(attempt)"))
                } catch where Date() < deadline {
                    attempt += 1
                    usleep(200_000)
                }
            }
        }
    }

    /// The systems' rows, and the systems that could not be measured, with why.
    public func run() async throws -> (results: [InvalidationResult], skipped: [SkippedReference]) {
        let group = try TemporaryGroup()
        defer { group.remove() }
        var results: [InvalidationResult] = []
        var skipped: [SkippedReference] = []
        let directory = URL(fileURLWithPath: group.directory.path)
        for (index, reference) in references.enumerated() {
            progress.begin(step: index + 1, of: references.count, label: "peer death: \(reference.resultName)")
            var deaths: [ReferenceSession.PeerDeath] = []
            var failure: (any Error)?
            do {
                for trial in 0..<trials {
                    let session = try await Self.start(reference, in: directory, instance: "-kill\(trial)")
                    do {
                        deaths.append(try await session.killDuringRoundTrips())
                        _ = try? await runBlocking { session.stop() }
                    } catch {
                        _ = try? await runBlocking { session.stop() }
                        throw error
                    }
                    // One wait for a deadline is enough to know that nothing noticed.
                    if deaths.last?.detected == false { break }
                }
            } catch {
                failure = error
            }
            // Started once more and stopped in order, whatever happened: a system whose server
            // cleans up after a killed predecessor (iceoryx's RouDi removes what a killed one
            // left in /dev/shm and /tmp) then leaves nothing behind.
            do {
                let tidy = try await Self.start(reference, in: directory, instance: "-tidy")
                _ = try? await runBlocking { tidy.stop() }
            } catch {
                skipped.append(SkippedReference(system: reference.system, reason: "starting it again after the kills, to clean up, failed: \(error)", mode: "peer death"))
            }
            if let failure {
                progress.end(label: reference.resultName, summary: "not measured: \(failure)")
                skipped.append(SkippedReference(system: reference.system, reason: "\(failure)", mode: "peer death"))
                continue
            }
            guard let last = deaths.last else { continue }
            let noticed = deaths.filter(\.detected).count
            let outcome = last.detected
                ? last.said
                : (noticed > 0 ? "noticed in \(noticed) of \(deaths.count) trials; then " : "") + "the client noticed nothing and gave up at its own \(ReferenceSession.clientDeadline) deadline: \(last.said)"
            let result = InvalidationResult(
                transport: reference.resultName, trials: deaths.map(\.nanoseconds), reference: true, detected: last.detected, outcome: outcome
            )
            progress.end(label: reference.resultName, summary: last.detected ? "median \(formatMicroseconds(result.median)): \(last.said)" : String(format: "not detected (the client gave up after %.1f s)", Double(result.maximum) / 1e9))
            results.append(result)
        }
        return (results, skipped)
    }
}
