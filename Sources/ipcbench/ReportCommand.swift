import ArgumentParser
import Foundation
import IPCBenchKit

struct ReportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "report",
        abstract: "Render result files as Markdown and one self-contained HTML page with charts."
    )

    @Argument(help: "results.json files written by ipcbench, or the run directories that hold them.")
    var files: [String]

    @Option(help: "Directory for report.md and report.html. Default: the first file's directory.")
    var output: String?

    func validate() throws {
        guard !files.isEmpty else { throw ValidationError("give at least one results.json") }
    }

    func run() throws {
        let loaded = try files.map { (label: $0, results: try ResultStore.read($0)) }
        let directory = output ?? URL(fileURLWithPath: files[0]).deletingLastPathComponent().path
        try ResultStore.writeReports(loaded, to: directory)
        print("wrote \(directory)/report.md and \(directory)/report.html")
    }
}
