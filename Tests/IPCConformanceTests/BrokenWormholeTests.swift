import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import NotifyTransport
import Synchronization
import Testing
import Wormhole

/// A mailbox that breaks one rule of area 10, around the real one.
struct BrokenWormhole: WormholeMailbox {
    enum Violation: String, CaseIterable, Sendable, CustomTestStringConvertible {
        /// Messages live in this process's memory only.
        case processLocal
        /// A read drops the message's last byte.
        case tornReads
        /// Listeners are never given anything.
        case silentListeners
        /// stopListening leaves the streams open.
        case ignoresStopListening
        /// Clearing does nothing.
        case ignoresClear

        var testDescription: String { rawValue }
    }

    let base: Wormhole<NotifyCenter>
    let violation: Violation
    private let local = LocalMessages()

    init(group: GroupDirectory, violation: Violation) throws {
        base = try Wormhole(group: group, center: try NotifyCenter(group: group))
        self.violation = violation
    }

    func passMessage(_ payload: [UInt8], identifier: String) throws {
        if violation == .processLocal { return local.messages.withLock { $0[identifier] = payload } }
        try base.passMessage(payload, identifier: identifier)
    }

    func message(withIdentifier identifier: String) throws -> [UInt8]? {
        switch violation {
        case .processLocal: return local.messages.withLock { $0[identifier] }
        case .tornReads: return try base.message(withIdentifier: identifier).map { Array($0.dropLast()) }
        default: return try base.message(withIdentifier: identifier)
        }
    }

    func clearMessageContents(forIdentifier identifier: String) throws {
        if violation != .ignoresClear { try base.clearMessageContents(forIdentifier: identifier) }
    }

    func clearAllMessageContents() throws {
        if violation != .ignoresClear { try base.clearAllMessageContents() }
    }

    func listen(forIdentifier identifier: String) throws -> AsyncStream<[UInt8]> {
        let stream = try base.listen(forIdentifier: identifier)
        guard violation == .silentListeners else { return stream }
        return AsyncStream { continuation in
            Task {
                for await _ in stream {}
                continuation.finish()
            }
        }
    }

    func stopListening(forIdentifier identifier: String) {
        if violation != .ignoresStopListening { base.stopListening(forIdentifier: identifier) }
    }
}

private final class LocalMessages: Sendable {
    let messages = Mutex<[String: [UInt8]]>([:])
}

/// Every rule of area 10 can fail: each broken mailbox breaks one, and its cases fail (while the
/// real one passes them all, in ``BuiltInTransportTests``).
@Suite("Conformance: broken wormhole mailboxes are caught", .serialized)
struct BrokenWormholeTests {
    static let expectations: [(BrokenWormhole.Violation, [String])] = [
        (.processLocal, ["10.1"]),
        (.tornReads, ["10.1", "10.2"]),
        (.silentListeners, ["10.3"]),
        (.ignoresStopListening, ["10.3"]),
        (.ignoresClear, ["10.4"]),
    ]

    @Test(arguments: expectations.map(\.0))
    func violationIsCaught(_ violation: BrokenWormhole.Violation) async throws {
        let failing = try #require(Self.expectations.first { $0.0 == violation }?.1)
        var subject = try TransportCatalog.conformanceSubject(named: "notify")
        subject.wormhole = WormholeAccess(program: try PeerProcess.executableURL(), programArguments: ["wormhole"]) {
            try BrokenWormhole(group: $0, violation: violation)
        }
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: failing)).run()
        for id in failing {
            let result = try #require(report.result(id))
            #expect(result.grade == .failed, "\(violation): \(id): \(result.grade): \(result.detail)")
        }
    }
}
