import Foundation
import FoundationXML
import IPCBenchKit
import IPCConformance
import IPCTestSupport
import Testing

/// The suite against every built-in transport, through `ipcbench conform` in a process of its
/// own: that checks the command and its report files too, and keeps the suite's descriptor
/// accounting clear of the other tests running in this process. Serialized: message-port
/// queues count against a small per-user quota.
@Suite("Conformance: built-in transports", .serialized, .usesMessageQueues)
struct BuiltInTransportTests {
    @Test("every applicable case passes", arguments: TransportCatalog.names)
    func transportConforms(_ name: String) async throws {
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("conform-\(name)-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: output) }
        // A deadline five times the command's 2 s: this runs beside the other suites, on two
        // CPUs, and a starved run once took longer than 2 s to fail a killed peer's pending
        // request (unix-socket, 6.2). The 2 s itself is what `ipcbench conform` reports
        // (Reports/conformance); BrokenTransportTests shows each deadline case can fail.
        let (status, table) = try await PeerProcess.runToCompletion(["conform", "--transport", name, "--deadline", "10", "--output", output])
        let reports = try JSONDecoder.iso8601.decode([ConformanceReport].self, from: Data(contentsOf: URL(fileURLWithPath: output + "/" + ConformanceReportWriter.fileNames.json)))
        #expect(!reports.isEmpty)
        for report in reports {
            #expect(report.results.count == ConformanceSuite.catalog.count)
            #expect(report.isSuccess, "\(report.failures.map { "\($0.id): \($0.detail)" })")
        }
        #expect(status == 0, "\(table)")
        // JUnit XML that an XML parser accepts, with one testcase per result.
        let junit = try XMLDocument(contentsOf: URL(fileURLWithPath: output + "/" + ConformanceReportWriter.fileNames.junit))
        #expect(try junit.nodes(forXPath: "/testsuites/testsuite/testcase").count == reports.reduce(0) { $0 + $1.results.count })
        for file in [ConformanceReportWriter.fileNames.markdown, ConformanceReportWriter.fileNames.html] {
            #expect(FileManager.default.fileExists(atPath: output + "/" + file))
        }
    }
}

extension JSONDecoder {
    static var iso8601: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
