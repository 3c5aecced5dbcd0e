import Foundation
import IPCFraming

/// The report's first section, "Which should I use": this package's transports and the reference
/// systems (``ReferenceSystem``) side by side, per placement, on the figures a reader choosing
/// between them asks for, with who wins each and by what factor.
public struct ChoiceReport: Sendable {
    /// One figure a reader compares: how to read it from a run, and which way is better.
    struct Metric: Sendable {
        var title: String
        var unit: String
        var lowerIsBetter: Bool
        var value: @Sendable (Candidate, _ latency: [LatencyResult], _ throughput: [ThroughputResult]) -> Double?
    }

    /// A transport (with its framing) or a reference system, as a row of the comparison.
    struct Candidate: Sendable, Hashable {
        var transport: String
        var framing: String?
        var isReference: Bool

        var label: String {
            if isReference { return transport }
            return framing.map { "\(transport) (\($0))" } ?? transport
        }
    }

    static let metrics: [Metric] = {
        func latency(_ title: String, size: Int, _ value: @escaping @Sendable (LatencyResult) -> Double?) -> Metric {
            Metric(title: title, unit: "µs", lowerIsBetter: true) { candidate, rows, _ in
                rows.first { candidate.matches($0.transport, $0.framing?.rawValue) && $0.payloadBytes == size }.flatMap(value)
            }
        }
        return [
            latency("p50 64 B", size: 64) { Double($0.p50) / 1000 },
            latency("p99 64 B", size: 64) { Double($0.p99) / 1000 },
            latency("p50 4 KiB", size: 4096) { Double($0.p50) / 1000 },
            latency("p99 4 KiB", size: 4096) { Double($0.p99) / 1000 },
            Metric(title: "64 B messages/s", unit: "k/s", lowerIsBetter: false) { candidate, _, rows in
                rows.first { candidate.matches($0.transport, $0.framing?.rawValue) && $0.payloadBytes == 64 }.map { $0.messagesPerSecond / 1000 }
            },
            Metric(title: "1 MiB MB/s", unit: "MB/s", lowerIsBetter: false) { candidate, _, rows in
                rows.first { candidate.matches($0.transport, $0.framing?.rawValue) && $0.payloadBytes == 1 << 20 }.map { $0.bytesPerSecond / 1e6 }
            },
            latency("CPU per 64 B round trip", size: 64) { row in
                row.localCPUPerRoundTrip.flatMap { local in row.peerCPUPerRoundTrip.map { (local + $0) / 1000 } }
            },
        ]
    }()

    let placement: Placement
    let candidates: [Candidate]
    /// One value per metric per candidate (`nil`: not measured).
    let values: [[Double?]]

    /// The comparison for each placement of `results` that has at least one reference row;
    /// empty when the run measured no reference system.
    public static func sections(_ results: RunResults) -> [ChoiceReport] {
        let latency = results.latency.filter { !$0.spins && !$0.onGlobalExecutor && !$0.onLoopHandler && !$0.transport.hasPrefix("floor:") }
        let throughput = (results.throughput ?? []).filter { $0.waitStrategy == "blocking" && !$0.onGlobalExecutor && !$0.onLoopHandler && !$0.transport.hasPrefix("floor:") }
        guard latency.contains(where: { ReferenceSystem.isReference($0.transport) }) else { return [] }
        return Placement.allCases.compactMap { placement in
            let here = latency.filter { $0.placement == placement }
            let hereThroughput = throughput.filter { $0.placement == placement }
            guard here.contains(where: { ReferenceSystem.isReference($0.transport) }) else { return nil }
            let all = orderedUnique(here.map { Candidate(transport: $0.transport, framing: $0.framing?.rawValue, isReference: ReferenceSystem.isReference($0.transport)) })
            // Ours first, then the references, each in run order.
            let candidates = all.filter { !$0.isReference } + all.filter(\.isReference)
            let values = candidates.map { candidate in metrics.map { $0.value(candidate, here, hereThroughput) } }
            return ChoiceReport(placement: placement, candidates: candidates, values: values)
        }
    }

    /// Where each wins: for each metric, the best of ours against the best reference system.
    func verdicts() -> [String] {
        let metrics = Self.metrics
        return metrics.indices.compactMap { index in
            let metric = metrics[index]
            func best(_ references: Bool) -> (Candidate, Double)? {
                let measured = candidates.indices.compactMap { row in
                    candidates[row].isReference == references ? values[row][index].map { (candidates[row], $0) } : nil
                }.filter { $0.1 > 0 }
                return metric.lowerIsBetter ? measured.min { $0.1 < $1.1 } : measured.max { $0.1 < $1.1 }
            }
            guard let ours = best(false), let reference = best(true) else { return nil }
            let oursWins = metric.lowerIsBetter ? ours.1 <= reference.1 : ours.1 >= reference.1
            let (winner, loser) = oursWins ? (ours, reference) : (reference, ours)
            let factor = metric.lowerIsBetter ? loser.1 / winner.1 : winner.1 / loser.1
            return String(
                format: "%@: %@ %@ (%@ %@ against %@ %@ for %@), %.2f×",
                metric.title, winner.0.label, oursWins ? "beats the best reference system" : "beats every transport here",
                SVGChart.format(winner.1), metric.unit, SVGChart.format(loser.1), metric.unit, loser.0.label, factor
            )
        }
    }

    /// The Markdown of the section for every placement; empty when there is no reference row.
    public static func markdown(_ results: RunResults) -> String {
        let sections = sections(results)
        let skipped = results.skippedReferences ?? []
        guard !sections.isEmpty || !skipped.isEmpty else { return "" }
        var text = "\n## Which should I use\n\n" + introduction + "\n\n"
        for section in sections {
            text += "### \(section.placement.rawValue)\n\n"
            let columns = ["transport or reference"] + metrics.map { "\($0.title) (\($0.unit))" }
            let rows = section.candidates.indices.map { row in
                [section.candidates[row].label] + section.values[row].map { $0.map(SVGChart.format) ?? "-" }
            }
            text += ReportRenderer.markdownTable(columns, rows, leftAligned: 1)
            text += "\n" + section.verdicts().map { "- \($0)\n" }.joined() + "\n"
        }
        if !skipped.isEmpty {
            text += "Not measured:\n\n" + skipped.map { "- " + ReportRenderer.skippedReferenceLine($0) + "\n" }.joined()
        }
        return text
    }

    /// The HTML of the section: per placement, charts (latency, throughput, CPU) and the table.
    public static func html(_ results: RunResults, label: String) -> String {
        let sections = sections(results)
        let skipped = results.skippedReferences ?? []
        guard !sections.isEmpty || !skipped.isEmpty else { return "" }
        var html = "<h2>\(SVGChart.escape(label))Which should I use</h2>\n<p>\(SVGChart.escape(introduction))</p>\n"
        for section in sections {
            func series(_ indices: [Int]) -> [SVGChart.Series] {
                section.candidates.indices.map { row in
                    SVGChart.Series(
                        name: section.candidates[row].label,
                        values: indices.map { section.values[row][$0] },
                        family: section.candidates[row].isReference ? .reference : .ours
                    )
                }
            }
            let latencyIndices = [0, 1, 2, 3]
            html += "<figure>" + SVGChart.bars(title: "Round trip, \(section.placement)", xLabels: latencyIndices.map { metrics[$0].title }, yLabel: "µs", series: series(latencyIndices)) + "</figure>\n"
            html += "<figure>" + SVGChart.bars(title: "64 B one-way messages per second (thousands), \(section.placement)", xLabels: ["64 B"], yLabel: "k messages/s", series: series([4])) + "</figure>\n"
            html += "<figure>" + SVGChart.bars(title: "1 MiB one-way throughput, \(section.placement)", xLabels: ["1 MiB"], yLabel: "MB/s", series: series([5])) + "</figure>\n"
            html += "<figure>" + SVGChart.bars(title: "CPU time of both processes per 64 B round trip, \(section.placement)", xLabels: ["64 B"], yLabel: "µs", series: series([6])) + "</figure>\n"
            html += "<table><tr>" + (["transport or reference"] + metrics.map { "\($0.title) (\($0.unit))" }).map { "<th>\(SVGChart.escape($0))</th>" }.joined() + "</tr>\n"
            for row in section.candidates.indices {
                let cells = [section.candidates[row].label] + section.values[row].map { $0.map(SVGChart.format) ?? "-" }
                html += "<tr>" + cells.map { "<td>\(SVGChart.escape($0))</td>" }.joined() + "</tr>\n"
            }
            html += "</table>\n<ul>" + section.verdicts().map { "<li>\(SVGChart.escape($0))</li>" }.joined() + "</ul>\n"
        }
        if !skipped.isEmpty {
            html += "<p>Not measured:</p><ul>" + skipped.map { "<li>\(SVGChart.escape(ReportRenderer.skippedReferenceLine($0)))</li>" }.joined() + "</ul>\n"
        }
        return html
    }

    static let introduction = """
        This package's transports (blocking, binary framing and HTTP framing for the Unix socket) beside what a Linux or Swift developer would use instead, measured in the same run, in the same sweeps, with the same clock, histograms and placements: `ref:zmq-reqrep` and `ref:zmq-pushpull` (ZeroMQ over `ipc://`, C), `ref:dbus-daemon` (a method call through a private `dbus-daemon`, sd-bus in C), `ref:dbus-p2p` (peer-to-peer D-Bus, no daemon), `ref:nio` (a length-prefixed echo over a Unix socket with SwiftNIO) `ref:grpc` (grpc-swift 2 on its NIO transport over a Unix socket, unary echo and a client stream) and `ref:grpc-cpp` (gRPC C++, the same calls and bytes). Each reference checks every byte of every echo. Their CPU time counts every process on the serving side (for `dbus-daemon`, the daemon too). Round trips: p50 and p99; throughput: one-way messages timed until the receiver has them all.
        """
}

extension ChoiceReport.Candidate {
    func matches(_ transport: String, _ framing: String?) -> Bool {
        self.transport == transport && self.framing == framing
    }
}

extension ReportRenderer {
    /// One line saying which reference system (or which of its measurements) was not measured, and why.
    public static func skippedReferenceLine(_ skipped: SkippedReference) -> String {
        let what = [skipped.mode, skipped.payloadBytes.map(formatBytes)].compactMap { $0 }.joined(separator: " of ")
        return "skipped \(ReferenceSystem.prefix)\(skipped.system)\(what.isEmpty ? "" : " (\(what))"): \(skipped.reason)"
    }
}
