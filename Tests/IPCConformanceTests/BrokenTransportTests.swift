import IPCBenchKit
import IPCConformance
import IPCCore
import IPCSecureCoding
import Testing
import UnixSocketTransport
import IPCFraming

/// Every rule the suite checks can fail: each broken transport or codec breaks one rule, and
/// the case for that rule must fail (while the same case passes against the real transport, in
/// ``BuiltInTransportTests``). Serialized: the cases measure deadlines, which a machine busy
/// with many peer processes at once would blur.
@Suite("Conformance: broken transports are caught", .serialized)
struct BrokenTransportTests {
    /// A violation and the cases that must fail because of it.
    struct Expectation: Sendable, CustomTestStringConvertible {
        var violation: Violation
        var failingCases: [String]
        var testDescription: String { "\(violation) fails \(failingCases.joined(separator: ", "))" }
    }

    static let expectations: [Expectation] = [
        Expectation(violation: .dropsAMessage, failingCases: ["1.1", "1.2", "1.5"]),
        Expectation(violation: .duplicatesAMessage, failingCases: ["1.2"]),
        Expectation(violation: .reordersMessages, failingCases: ["1.1"]),
        Expectation(violation: .corruptsLargePayloads, failingCases: ["1.3"]),
        Expectation(violation: .ignoresItsMaximum, failingCases: ["1.4"]),
        Expectation(violation: .broadcastsToOne, failingCases: ["1.7"]),
        Expectation(violation: .ignoresAcceptFilter, failingCases: ["5.9"]),
        Expectation(violation: .filtersOnTheLoop, failingCases: ["5.11"]),
        Expectation(violation: .ignoresConnectionLimit, failingCases: ["5.12"]),
        Expectation(violation: .busyLooksLikeNobody, failingCases: ["5.12", "7.6"]),
        Expectation(violation: .silenceLooksLikeNobody, failingCases: ["7.7"]),
        Expectation(violation: .ignoresBorrowingHandler, failingCases: ["1.8"]),
        Expectation(violation: .connectsWithoutBorrowingHandler, failingCases: ["1.9"]),
        Expectation(violation: .acceptsHostileLengths, failingCases: ["2.3"]),
        Expectation(violation: .hidesProtocolErrors, failingCases: ["2.4", "2.5"]),
        Expectation(violation: .strayReplies, failingCases: ["4.1"]),
        Expectation(violation: .failuresLookLikeTimeouts, failingCases: ["4.2"]),
        Expectation(violation: .wrongTimeoutCode, failingCases: ["4.3", "4.5"]),
        Expectation(violation: .sendTimeoutAsFailure, failingCases: ["4.4"]),
        Expectation(violation: .requestsOutliveTheConnection, failingCases: ["4.6", "5.4", "6.2", "7.1", "7.2"]),
        Expectation(violation: .wrongEndpointInUseCode, failingCases: ["5.1"]),
        Expectation(violation: .refusesStaleEndpoints, failingCases: ["5.2"]),
        Expectation(violation: .wrongEndpointNotFoundCode, failingCases: ["5.3", "5.8", "7.3", "7.4"]),
        Expectation(violation: .slowToFindNobody, failingCases: ["7.5"]),
        Expectation(violation: .refusalLooksLikeACrash, failingCases: ["5.10"]),
        Expectation(violation: .neverInvalidates, failingCases: ["5.4", "5.6", "6.1", "6.3", "7.1"]),
        Expectation(violation: .invalidatesTwice, failingCases: ["5.4"]),
        Expectation(violation: .sendsAfterInvalidation, failingCases: ["5.5", "6.1"]),
        Expectation(violation: .ignoresLateHandlers, failingCases: ["5.7"]),
        Expectation(violation: .leaksADescriptor, failingCases: ["6.1"]),
        Expectation(violation: .claimsProcessWatch, failingCases: ["6.5.2"]),
        Expectation(violation: .keepsDeadConnections, failingCases: ["6.6"]),
        Expectation(violation: .serverQuitsOnClientDeath, failingCases: ["6.6"]),
        Expectation(violation: .waitsOnAThreadPerSend, failingCases: ["11.6"]),
    ]

    @Test(arguments: expectations)
    func violationIsCaught(_ expectation: Expectation) async throws {
        let reference = try TransportCatalog.conformanceSubject(named: "unix-socket")
        var subject = ConformanceSubject(
            BrokenTransport(base: UnixSocketTransport(), violation: expectation.violation),
            peers: reference.peers,
            rawStream: reference.rawStream
        )
        subject.payloadCodecs = [.json]
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: expectation.failingCases)).run()
        for id in expectation.failingCases {
            let result = try #require(report.result(id))
            #expect(result.grade == .failed, "\(id): \(result.grade): \(result.detail)")
        }
    }

    @Test("a codec that reports every refusal as malformedPayload fails the cases that need disallowedType and nestingTooDeep")
    func mislabellingCodecIsCaught() async throws {
        let report = try await run(codec: BrokenCodec(base: .json, violation: .oneErrorForEverything), cases: ["3"])
        #expect(report.result("3.1")?.grade == .failed)
        #expect(report.result("3.2")?.grade == .failed)
        #expect(report.result("3.3")?.grade == .passed)
        #expect(report.result("3.4")?.grade == .passed)
        #expect(report.result("3.5")?.grade == .failed)
        #expect(report.result("3.6")?.grade == .failed)
    }

    @Test("a codec that accepts what does not parse fails the truncation and garbage cases")
    func acceptingCodecIsCaught() async throws {
        let report = try await run(codec: BrokenCodec(base: .propertyList, violation: .acceptsMalformedPayloads), cases: ["3.3", "3.4"])
        #expect(report.result("3.3")?.grade == .failed)
        #expect(report.result("3.4")?.grade == .failed)
    }

    @Test("plain HTTP framing claiming to be LLBSD-compatible fails 2.6 (an LLBSD peer's frames are dropped as stray replies), which the llbsd framing passes")
    func httpClaimingLLBSDIsCaught() async throws {
        let reference = try TransportCatalog.conformanceSubject(named: "unix-socket", framing: .llbsd)
        let claiming = ConformanceSubject(
            UnixSocketTransport(framing: .http),
            peers: reference.peers,
            rawStream: reference.rawStream
        )
        let broken = await ConformanceSuite(subject: claiming, options: ConformanceOptions(cases: ["2.6"])).run()
        #expect(broken.result("2.6")?.grade == .failed, "\(String(describing: broken.result("2.6")))")
        let real = await ConformanceSuite(subject: reference, options: ConformanceOptions(cases: ["2.6"])).run()
        #expect(real.result("2.6")?.grade == .passed, "\(String(describing: real.result("2.6")))")
    }

    @Test("a peer whose transport leaks descriptors into a spawned child fails 6.5.1")
    func leakedDescriptorsAreCaught() async throws {
        var subject = try TransportCatalog.conformanceSubject(named: "unix-socket")
        subject.peers = LeakingPeers(base: subject.peers)
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: ["6.5.1"])).run()
        #expect(report.result("6.5.1")?.grade == .failed, "\(String(describing: report.result("6.5.1")))")
    }

    @Test("peers whose handler blocks the loop (a synchronous handler that sleeps) fail the serving cases it breaks, and pass serial order")
    func blockingHandlerIsCaught() async throws {
        var subject = try TransportCatalog.conformanceSubject(named: "unix-socket")
        subject.peers = ServingPeers(base: subject.peers) { $0.serving = .blockingOnLoop }
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: ["11.1", "11.2", "11.3", "11.4", "11.5"])).run()
        for id in ["11.1", "11.2", "11.4", "11.5"] {
            #expect(report.result(id)?.grade == .failed, "\(id): \(String(describing: report.result(id)))")
        }
        // One request at a time on the loop keeps arrival order, wrongly or not.
        #expect(report.result("11.3")?.grade == .passed, "\(String(describing: report.result("11.3")))")
    }

    @Test("peers that handle one connection's requests all at once, by default, fail serial order (11.3)")
    func unboundedConcurrencyIsCaught() async throws {
        var subject = try TransportCatalog.conformanceSubject(named: "unix-socket")
        subject.peers = ServingPeers(base: subject.peers) { $0.maximumConcurrentRequests = 64 }
        let report = await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: ["11.3"])).run()
        #expect(report.result("11.3")?.grade == .failed, "\(String(describing: report.result("11.3")))")
    }

    private func run(codec: BrokenCodec, cases: [String]) async throws -> ConformanceReport {
        var subject = try TransportCatalog.conformanceSubject(named: "unix-socket")
        subject.payloadCodecs = [codec]
        return await ConformanceSuite(subject: subject, options: ConformanceOptions(cases: cases)).run()
    }
}

/// Starts peers whose spawned grandchild inherits every descriptor, as if their transport
/// forgot close-on-exec.
struct LeakingPeers: ConformancePeerLauncher {
    let base: any ConformancePeerLauncher

    func launch(_ configuration: ConformancePeer.Configuration) throws -> any ConformancePeerProcess {
        var configuration = configuration
        if configuration.grandchild == .spawn { configuration.grandchild = .spawnLeakingDescriptors }
        return try base.launch(configuration)
    }
}

/// Starts peers that serve otherwise than they are asked to (``ConformancePeer/Configuration/serving``,
/// ``ConformancePeer/Configuration/maximumConcurrentRequests``).
struct ServingPeers: ConformancePeerLauncher {
    let base: any ConformancePeerLauncher
    let change: @Sendable (inout ConformancePeer.Configuration) -> Void

    func launch(_ configuration: ConformancePeer.Configuration) throws -> any ConformancePeerProcess {
        var configuration = configuration
        change(&configuration)
        return try base.launch(configuration)
    }
}
