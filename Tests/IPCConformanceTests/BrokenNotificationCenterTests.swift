import IPCBenchKit
import IPCConformance
import IPCCore
import NotifyTransport
import Testing

/// A real notification center that breaks one rule of ``NamedNotificationCenter``.
struct BrokenNotificationCenter: NamedNotificationCenter {
    enum Violation: String, Sendable, CaseIterable {
        /// Registrations are never called.
        case neverCalls
        /// Every call happens twice.
        case callsTwice
        /// State keeps its low 32 bits only.
        case truncatesState
        /// Cancel does nothing.
        case ignoresCancel
        /// Suspend and resume do nothing.
        case ignoresSuspend
    }

    let base: NotifyCenter
    let violation: Violation

    func post(_ name: String) throws { try base.post(name) }

    func setState(_ value: UInt64, for name: String) throws {
        try base.setState(violation == .truncatesState ? value & 0xFFFF_FFFF : value, for: name)
    }

    func state(for name: String) throws -> UInt64 {
        let value = try base.state(for: name)
        return violation == .truncatesState ? value & 0xFFFF_FFFF : value
    }

    func register(_ name: String, handler: @escaping @Sendable () -> Void) throws -> BrokenRegistration {
        let violation = violation
        return BrokenRegistration(base: try base.register(name) {
            switch violation {
            case .neverCalls: break
            case .callsTwice: handler(); handler()
            default: handler()
            }
        }, violation: violation)
    }

    final class BrokenRegistration: NamedNotificationRegistration {
        let base: NotifyRegistration
        let violation: Violation

        init(base: NotifyRegistration, violation: Violation) {
            self.base = base
            self.violation = violation
        }

        func cancel() { if violation != .ignoresCancel { base.cancel() } }
        func suspend() { if violation != .ignoresSuspend { base.suspend() } }
        func resume() { if violation != .ignoresSuspend { base.resume() } }
    }
}

/// Every rule of area 8 can fail: each broken center breaks one, and its case fails (while the
/// real center passes them all, in ``BuiltInTransportTests``).
@Suite("Conformance: broken notification centers are caught", .serialized)
struct BrokenNotificationCenterTests {
    static let expectations: [(BrokenNotificationCenter.Violation, [String])] = [
        (.neverCalls, ["8.1", "8.2"]),
        (.callsTwice, ["8.1"]),
        (.truncatesState, ["8.3"]),
        (.ignoresCancel, ["8.4"]),
        (.ignoresSuspend, ["8.5"]),
    ]

    @Test(arguments: expectations.map(\.0))
    func violationIsCaught(_ violation: BrokenNotificationCenter.Violation) async throws {
        let failing = try #require(Self.expectations.first { $0.0 == violation }?.1)
        var subject = try TransportCatalog.conformanceSubject(named: "notify")
        subject.notifications = NotificationCenterAccess(poster: try PeerProcess.executableURL(), posterArguments: ["notifyutil"]) {
            BrokenNotificationCenter(base: try NotifyCenter(group: $0), violation: violation)
        }
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: failing)).run()
        for id in failing {
            let result = try #require(report.result(id))
            #expect(result.grade == .failed, "\(violation): \(id): \(result.grade): \(result.detail)")
        }
    }
}
