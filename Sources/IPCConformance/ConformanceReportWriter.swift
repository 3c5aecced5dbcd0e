import Foundation
import IPCCore

/// Renders the reports of one run (one per subject) for people and for CI: a plain-text table,
/// JSON, JUnit XML, Markdown and a self-contained HTML page.
public enum ConformanceReportWriter {
    /// The files ``write(_:to:)`` creates, by format.
    public static let fileNames = (json: "conformance.json", junit: "conformance.junit.xml", markdown: "conformance.md", html: "conformance.html")

    /// Writes every format into `directory`, creating it if needed, and returns the paths.
    /// - Throws: what creating the directory or writing a file throws.
    @discardableResult
    public static func write(_ reports: [ConformanceReport], to directory: String) throws -> [String] {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let files = [
            (fileNames.json, try json(reports)),
            (fileNames.junit, junitXML(reports)),
            (fileNames.markdown, markdown(reports)),
            (fileNames.html, html(reports)),
        ]
        return try files.map { name, contents in
            let path = (directory as NSString).appendingPathComponent(name)
            try contents.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
    }

    /// The reports as JSON: an array of ``ConformanceReport``, keys sorted so runs diff cleanly.
    /// - Throws: what `JSONEncoder` throws.
    public static func json(_ reports: [ConformanceReport]) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        return String(decoding: try encoder.encode(reports), as: UTF8.self) + "\n"
    }

    /// A table for a terminal: id, result, statement and detail, one case a line.
    public static func table(_ report: ConformanceReport) -> String {
        let rows = report.results.map { [$0.id, $0.grade.rawValue, $0.statement, $0.detail] }
        let header = ["id", "result", "statement", "detail"]
        // Statements and details are long: cap their columns so a row stays readable.
        let caps = [8, 16, 60, 90]
        let widths = (0..<header.count).map { column in
            min(caps[column], ([header] + rows).map { $0[column].count }.max() ?? 0)
        }
        func line(_ cells: [String]) -> String {
            zip(cells, widths).map { cell, width in
                let clipped = cell.count > width ? String(cell.prefix(width - 1)) + "…" : cell
                return clipped.padding(toLength: width, withPad: " ", startingAt: 0)
            }.joined(separator: "  ")
        }
        var lines = [report.subject, line(header), line(widths.map { String(repeating: "-", count: $0) })]
        lines += rows.map(line)
        lines.append(report.summary)
        return lines.joined(separator: "\n") + "\n"
    }

    /// Every case id that any report has, in catalog order, with its statement and each
    /// report's grade for it (`nil` where that report did not run it).
    static func matrix(_ reports: [ConformanceReport]) -> [(id: String, statement: String, grades: [ConformanceResult.Grade?])] {
        var rows: [(id: String, statement: String, grades: [ConformanceResult.Grade?])] = []
        for testCase in ConformanceSuite.catalog where reports.contains(where: { $0.result(testCase.id) != nil }) {
            rows.append((testCase.id, testCase.statement, reports.map { $0.result(testCase.id)?.grade }))
        }
        return rows
    }

    /// What a transport declared, in one line.
    static func capabilities(_ report: ConformanceReport) -> String {
        let declared = report.capabilities
        var parts = [
            "maximum payload \(declared.maximumPayloadLength.formattedBytes)",
            "peer death by \(declared.peerDeathDetection.rawValue)",
        ]
        let flags = [
            ("order", declared.preservesOrder), ("request/reply", declared.supportsRequestReply),
            ("broadcast", declared.supportsBroadcast), ("accept filter", declared.supportsAcceptFilter),
            ("spinning", declared.supportsSpinning), ("connection limit", declared.supportsConnectionLimit),
        ]
        parts.append("offers " + flags.filter(\.1).map(\.0).joined(separator: ", "))
        if let framing = report.framing { parts.append("raw stream in \(framing) framing") }
        if !report.payloadCodecs.isEmpty { parts.append("codecs " + report.payloadCodecs.joined(separator: ", ")) }
        return parts.joined(separator: "; ")
    }

    /// A short mark for a grade, for matrices.
    static func mark(_ grade: ConformanceResult.Grade?) -> String {
        switch grade {
        case .passed: "pass"
        case .failed: "FAIL"
        case .nonStrict: "non-strict"
        case .informational: "info"
        case .notApplicable: "n/a"
        case .expectedFailure: "xfail"
        case .unexpectedPass: "XPASS"
        case nil: ""
        }
    }

    /// Escapes text for XML and HTML content and attribute values.
    static func escaped(_ text: String) -> String {
        var result = ""
        result.reserveCapacity(text.count)
        for character in text.unicodeScalars {
            switch character {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&quot;"
            case "'": result += "&apos;"
            // XML 1.0 allows no other control characters, even escaped.
            case "\t", "\n", "\r": result.unicodeScalars.append(character)
            case _ where character.value < 0x20: result += "?"
            default: result.unicodeScalars.append(character)
            }
        }
        return result
    }

    /// `"1.5 s"`.
    static func formattedSeconds(_ seconds: Double) -> String {
        "\((seconds * 10).rounded() / 10) s"
    }
}
