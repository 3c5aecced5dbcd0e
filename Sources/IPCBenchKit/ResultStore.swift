import Foundation
import IPCCore

/// Reads and writes result files.
public enum ResultStore {
    /// Writes `results.json`, `report.md` and `report.html` into `directory`, creating it.
    public static func write(_ results: RunResults, to directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(results).write(to: URL(fileURLWithPath: directory + "/results.json"))
        try writeReports([(label: "results.json", results: results)], to: directory)
    }

    /// Writes `report.md` and `report.html` for one or more result files.
    public static func writeReports(_ files: [(label: String, results: RunResults)], to directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let markdown = files.map { ReportRenderer.markdown($0.results) }.joined(separator: "\n")
        try Data(markdown.utf8).write(to: URL(fileURLWithPath: directory + "/report.md"))
        try Data(HTMLReport.render(files).utf8).write(to: URL(fileURLWithPath: directory + "/report.html"))
    }

    /// Reads a result file.
    /// - Throws: ``IPCError/Code/malformedPayload`` if it is not a result file of a schema this
    ///   version reads.
    public static func read(_ path: String) throws -> RunResults {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let results: RunResults
        do {
            results = try JSONDecoder().decode(RunResults.self, from: data)
        } catch {
            throw IPCError(code: .malformedPayload, message: "\(path) is not an ipcbench result file", cause: error)
        }
        guard results.schema == RunResults.currentSchema else {
            throw IPCError(code: .malformedPayload, message: "\(path) has schema \(results.schema); this ipcbench reads \(RunResults.currentSchema)")
        }
        return results
    }
}
