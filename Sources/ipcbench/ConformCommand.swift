import ArgumentParser
import Foundation
import IPCBenchKit
import IPCConformance
import IPCFraming

struct ConformCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conform",
        abstract: "Run the conformance suite against the built-in transports and write a report.",
        discussion: """
        Runs every case (or those --cases selects) against each transport, with its peers in \
        separate ipcbench processes; a transport with a selectable framing runs once per \
        framing. Prints a table per transport and writes conformance.json, conformance.junit.xml, \
        conformance.md and conformance.html. Exits with status 1 if a case failed or an expected \
        failure passed.
        """
    )

    @Option(name: .customLong("transport"), help: "Transport to check; repeat for several. Known: \(TransportCatalog.names.joined(separator: ", ")). Default: all.")
    var transports: [String] = []

    @Option(name: .customLong("framing"), help: "For transports with a framing: binary, http or llbsd; repeat for several. Default: all three.")
    var framings: [Framing] = []

    @Option(help: "Case id prefixes, comma-separated (for example 1,6.5). Default: every case.")
    var cases: String?

    @Option(help: "A file of case id prefixes expected to fail, one per line (# starts a comment).")
    var expectedFailures: String?

    @Option(help: "Directory for the report files.")
    var output: String = "Reports/conformance"

    @Option(help: "Seconds within which a survivor must report a peer's death.")
    var deadline: Double = 2

    @Flag(help: "List the cases and exit.")
    var list = false

    func validate() throws {
        for transport in transports where !TransportCatalog.names.contains(transport) {
            throw ValidationError("unknown transport '\(transport)'; known: \(TransportCatalog.names.joined(separator: ", "))")
        }
        guard deadline > 0 else { throw ValidationError("--deadline must be positive") }
    }

    func run() async throws {
        if list {
            for testCase in ConformanceSuite.catalog { print("\(testCase.id)\t\(testCase.statement)") }
            return
        }
        var options = ConformanceOptions(invalidationDeadline: .milliseconds(Int(deadline * 1000)))
        options.cases = cases.map { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } } ?? []
        if let expectedFailures { options.expectedFailures = try ConformanceOptions.expectedFailures(fromFile: expectedFailures) }
        options.onResult = { result in
            FileHandle.standardError.write(Data("  \(result.id) \(result.grade)\n".utf8))
        }
        let subjects = try TransportCatalog.conformanceSubjects(named: transports).filter { subject in
            // A subject named "unix-socket (http)" runs only when its framing is selected.
            framings.isEmpty || subject.rawStream.map { framings.contains($0.framing) } ?? true
        }
        var reports: [ConformanceReport] = []
        for subject in subjects {
            fflush(nil)  // the table printed for the subject before, ahead of this line
            FileHandle.standardError.write(Data("\(subject.name):\n".utf8))
            let report = await ConformanceSuite(subject: subject, options: options).run()
            print(ConformanceReportWriter.table(report))
            reports.append(report)
        }
        for path in try ConformanceReportWriter.write(reports, to: output) { print("wrote \(path)") }
        if !reports.allSatisfy(\.isSuccess) { throw ExitCode(1) }
    }
}
