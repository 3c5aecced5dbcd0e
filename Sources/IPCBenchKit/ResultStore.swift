import Foundation
import IPCCore

/// Reads and writes result files.
public enum ResultStore {
    /// Writes `results.json` and `report.md` into `directory`, creating it.
    public static func write(_ results: RunResults, to directory: String) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(results).write(to: URL(fileURLWithPath: directory + "/results.json"))
        try Data(ReportRenderer.markdown(results).utf8).write(to: URL(fileURLWithPath: directory + "/report.md"))
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
