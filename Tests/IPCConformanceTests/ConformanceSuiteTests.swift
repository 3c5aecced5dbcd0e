import Foundation
import FoundationXML
import IPCBenchKit
import IPCConformance
import IPCCore
import Testing
import UnixSocketTransport

/// The suite's own machinery: ids, selection, expected failures and report formats.
@Suite("Conformance: the suite itself")
struct ConformanceSuiteTests {
    @Test func idsAreUniqueAndGroupedByArea() {
        let ids = ConformanceSuite.catalog.map(\.id)
        #expect(Set(ids).count == ids.count)
        for testCase in ConformanceSuite.catalog {
            #expect(testCase.id.hasPrefix("\(testCase.area.rawValue)."), "\(testCase.id)")
            #expect(!testCase.statement.isEmpty)
        }
        #expect(Set(ConformanceSuite.catalog.map(\.area)) == Set(ConformanceArea.allCases))
    }

    @Test func prefixesSelectWholeComponents() throws {
        let subject = try TransportCatalog.conformanceSubject(named: "unix-socket")
        func selected(_ prefixes: [String]) -> [String] {
            ConformanceSuite(subject: subject, options: ConformanceOptions(cases: prefixes)).selectedCases.map(\.id)
        }
        #expect(selected(["6.5"]) == ["6.5.1", "6.5.2"])
        #expect(selected(["1.1", "6.4."]) == ["1.1", "6.4.1", "6.4.2"])
        #expect(selected(["6.5.1"]) == ["6.5.1"])
        #expect(selected(["1"]).allSatisfy { $0.hasPrefix("1.") })
        #expect(selected([]).count == ConformanceSuite.catalog.count)
    }

    @Test("a listed case that fails is an expected failure; a listed case that passes is reported")
    func expectedFailures() async throws {
        let reference = try TransportCatalog.conformanceSubject(named: "unix-socket")
        let broken = ConformanceSubject(BrokenTransport(base: UnixSocketTransport(), violation: .duplicatesAMessage), peers: reference.peers)
        let options = ConformanceOptions(cases: ["1.2", "5.5"], expectedFailures: ["1.2", "5.5"])
        let report = await ConformanceSuite(subject: broken, options: options).run()
        #expect(report.result("1.2")?.grade == .expectedFailure)
        #expect(report.result("5.5")?.grade == .unexpectedPass)
        #expect(!report.isSuccess)
        #expect(throws: ConformanceFailure.self) { try report.requireSuccess() }
    }

    @Test func expectedFailuresFileIgnoresCommentsAndBlankLines() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("xfail-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try "# known problems\n6.4.2   # slow connect\n\n 2.3\n".write(toFile: path, atomically: true, encoding: .utf8)
        #expect(try ConformanceOptions.expectedFailures(fromFile: path) == ["6.4.2", "2.3"])
    }

    @Test func peerArgumentsRoundTrip() throws {
        let endpoint = try Endpoint(group: GroupDirectory(path: "/tmp/g"), name: "g.peer")
        let configuration = ConformancePeer.Configuration(endpoint: endpoint, role: .client, burstCount: 3, burstSize: 9, grandchild: .fork)
        #expect(try ConformancePeer.Configuration(arguments: configuration.arguments) == configuration)
        for stall in [Duration.seconds(600), nil] {
            var stalling = configuration
            stalling.stalledFrameTimeout = stall
            #expect(try ConformancePeer.Configuration(arguments: stalling.arguments) == stalling)
        }
        let refusing = ConformancePeer.Configuration(endpoint: endpoint, role: .server, refusesClients: true)
        #expect(refusing.arguments.contains("--refuse-clients"))
        #expect(try ConformancePeer.Configuration(arguments: refusing.arguments) == refusing)
        #expect(throws: IPCError.self) { try ConformancePeer.Configuration(arguments: ["--group", "/tmp/g", "--endpoint", "x", "--role", "client", "--refuse-clients"]) }
        #expect(throws: IPCError.self) { try ConformancePeer.Configuration(arguments: ["--group", "/tmp/g", "--endpoint", "x", "--bogus", "1"]) }
        let limited = ConformancePeer.Configuration(endpoint: endpoint, role: .server, maximumConnections: 3)
        #expect(limited.arguments.suffix(2) == ["--maximum-connections", "3"])
        #expect(try ConformancePeer.Configuration(arguments: limited.arguments) == limited)
        for bad in [["--role", "client", "--maximum-connections", "3"], ["--maximum-connections", "0"], ["--maximum-connections", "many"]] {
            #expect(throws: IPCError.self) { try ConformancePeer.Configuration(arguments: ["--group", "/tmp/g", "--endpoint", "x"] + bad) }
        }
        #expect(ConformancePeer.Announcement(line: "READY 12 grandchild 13") == ConformancePeer.Announcement(pid: 12, grandchildPID: 13))
        #expect(ConformancePeer.Announcement(line: "READY 12") == ConformancePeer.Announcement(pid: 12))
        #expect(ConformancePeer.Announcement(line: "hello") == nil)
    }

    @Test("reports render every grade, and the JUnit XML parses")
    func reportFormats() throws {
        let results = ConformanceResult.Grade.allCases.enumerated().map { index, grade in
            ConformanceResult(id: ConformanceSuite.catalog[index].id, statement: ConformanceSuite.catalog[index].statement, grade: grade, detail: "<detail & \"quotes\"> \u{1}")
        }
        let capabilities = UnixSocketTransport().capabilities
        let report = ConformanceReport(subject: "toy <1>", capabilities: capabilities, framing: "binary", payloadCodecs: ["json"], results: results, startedAt: Date(), seconds: 1, invalidationDeadlineSeconds: 2)
        let junit = try XMLDocument(xmlString: ConformanceReportWriter.junitXML([report]))
        #expect(try junit.nodes(forXPath: "//testcase").count == results.count)
        #expect(try junit.nodes(forXPath: "//testcase/failure").count == 2)
        #expect(try junit.nodes(forXPath: "//testcase/skipped").count == 2)
        let markdown = ConformanceReportWriter.markdown([report])
        let html = ConformanceReportWriter.html([report])
        for grade in ConformanceResult.Grade.allCases {
            #expect(markdown.contains(grade.rawValue))
            #expect(html.contains("class=\"\(grade.rawValue)\""))
        }
        #expect(!html.contains("<detail"))
        let decoded = try JSONDecoder.iso8601.decode([ConformanceReport].self, from: Data(ConformanceReportWriter.json([report]).utf8))
        #expect(decoded.first?.results == results)
    }
}
