import Foundation
import IPCConformance
import Testing
import ToyTransport

/// The conformance suite against the toy transport, as any transport author would run it: the
/// transport in this process, its peers in `toy-peer` processes (built next to this test bundle).
@Suite("Toy transport conformance")
struct ToyTransportConformanceTests {
    static func peerExecutable() throws -> URL {
        let testBundle = URL(fileURLWithPath: try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
        var directory = testBundle.deletingLastPathComponent()
        if directory.lastPathComponent.hasSuffix(".xctest") { directory.deleteLastPathComponent() }
        return directory.appendingPathComponent("toy-peer")
    }

    @Test("every applicable case passes")
    func conforms() async throws {
        let subject = ConformanceSubject(ToyTransport(), peers: ExecutablePeerLauncher(executable: try Self.peerExecutable()))
        let report = await ConformanceSuite(subject: subject).run()
        print(ConformanceReportWriter.table(report))
        #expect(throws: Never.self) { try report.requireSuccess() }
    }
}
