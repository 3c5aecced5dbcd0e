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

    /// Reads a result file, or the `results.json` of a run directory (what `ipcbench run` writes
    /// into `--output`).
    /// - Throws: ``IPCError/Code/invalidEndpoint`` for a path that does not exist or cannot be
    ///   read, and a directory without a `results.json`; ``IPCError/Code/malformedPayload`` if it
    ///   is not a result file of a schema this version reads. Each says what was wrong, in words.
    public static func read(_ path: String) throws -> RunResults {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw IPCError(code: .invalidEndpoint, message: "\(path) does not exist (give a results.json, or the run directory that holds one)")
        }
        let file = isDirectory.boolValue ? (path.hasSuffix("/") ? path : path + "/") + "results.json" : path
        if isDirectory.boolValue, !FileManager.default.fileExists(atPath: file) {
            throw IPCError(code: .invalidEndpoint, message: "\(path) is a directory without a results.json (a run directory of ipcbench run holds one)")
        }
        guard FileManager.default.isReadableFile(atPath: file) else {
            throw IPCError(code: .invalidEndpoint, message: "\(file) cannot be read: permission denied")
        }
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: file))
        } catch {
            throw IPCError(code: .invalidEndpoint, message: "\(file) cannot be read (\(error.localizedDescription))")
        }
        let results: RunResults
        do {
            results = try JSONDecoder().decode(RunResults.self, from: data)
        } catch let error as DecodingError {
            throw IPCError(code: .malformedPayload, message: "\(file) is not an ipcbench result file: \(Self.describe(error))")
        } catch {
            throw IPCError(code: .malformedPayload, message: "\(file) is not an ipcbench result file: \(error.localizedDescription)")
        }
        guard results.schema == RunResults.currentSchema else {
            throw IPCError(code: .malformedPayload, message: "\(file) has schema \(results.schema); this ipcbench reads \(RunResults.currentSchema)")
        }
        return results
    }

    /// What a decoding error found, in words: where, and what.
    private static func describe(_ error: DecodingError) -> String {
        func at(_ path: [any CodingKey]) -> String {
            path.isEmpty ? "at the top level" : "at " + path.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .dataCorrupted(let context):
            return context.codingPath.isEmpty ? "it is not JSON" : "the value \(at(context.codingPath)) is not valid"
        case .keyNotFound(let key, let context):
            return "the field \(key.stringValue) is missing \(at(context.codingPath))"
        case .typeMismatch(_, let context), .valueNotFound(_, let context):
            return "the value \(at(context.codingPath)) has the wrong type"
        @unknown default:
            return "\(error)"
        }
    }
}
