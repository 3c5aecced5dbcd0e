import Foundation
import IPCFraming

/// The report's first section, "Which should I use": one answer per use case (lowest latency
/// with blocking waits and with spinning, throughput of small and of large messages, CPU per
/// message, what happens when a peer dies), this package's transports and the reference
/// systems (``ReferenceSystem``) side by side, per placement, with the winner and the factor
/// by which it wins.
public struct ChoiceReport: Sendable {
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

    /// One question a reader choosing a transport asks, and the figure that answers it.
    public struct UseCase: Sendable {
        public var title: String
        /// What the figure is, in one sentence.
        public var figure: String
        public var unit: String
        public var lowerIsBetter: Bool
        /// Each candidate's value per placement (`nil`: not measured there).
        var candidates: [Candidate]
        var values: [[Double?]]
        var placements: [Placement]
        /// What could not be measured for a candidate, in words (peer death of a reference).
        var notes: [String] = []

        /// The winner of each placement, and by what factor it leads the next candidate and,
        /// when the winner is one of ours, the best reference (or the reverse).
        func verdicts() -> [String] {
            placements.indices.compactMap { column in
                let measured = candidates.indices.compactMap { row in values[row][column].flatMap { $0 > 0 ? (candidates[row], $0) : nil } }
                    .sorted { lowerIsBetter ? $0.1 < $1.1 : $0.1 > $1.1 }
                guard let winner = measured.first else { return nil }
                func factor(_ other: Double) -> Double { lowerIsBetter ? other / winner.1 : winner.1 / other }
                func value(_ figure: Double) -> String { "\(SVGChart.format(figure)) \(unit)" }
                var line = "\(placements[column]): **\(winner.0.label)**, \(value(winner.1))"
                if measured.count > 1 {
                    let next = measured[1]
                    line += String(format: ", %.2f× ahead of the next, %@ (%@)", factor(next.1), next.0.label, value(next.1))
                }
                if let rival = measured.dropFirst(2).first(where: { $0.0.isReference != winner.0.isReference }), measured[1].0.isReference == winner.0.isReference {
                    line += String(format: "; the best %@, %@, %.2f× (%@)", rival.0.isReference ? "reference system" : "transport of this package", rival.0.label, factor(rival.1), value(rival.1))
                }
                return line
            }
        }
    }

    /// The use cases of `results`, in the report's order; a use case no row measures is left out.
    public static func useCases(_ results: RunResults) -> [UseCase] {
        let main = { (row: LatencyResult) in !row.onGlobalExecutor && !row.onLoopHandler && !row.transport.hasPrefix("floor:") }
        let blocking = results.latency.filter { main($0) && !$0.spins }
        let spinning = results.latency.filter { main($0) && $0.spins }
        let streams = (results.throughput ?? []).filter { $0.waitStrategy == "blocking" && !$0.onGlobalExecutor && !$0.onLoopHandler && $0.batch == nil && !$0.transport.hasPrefix("floor:") }
        let placements = Placement.allCases.filter { placement in results.latency.contains { $0.placement == placement } }
        func candidate(_ transport: String, _ framing: Framing?) -> Candidate {
            Candidate(transport: transport, framing: framing?.rawValue, isReference: ReferenceSystem.isReference(transport))
        }
        func ordered(_ all: [Candidate]) -> [Candidate] {
            let unique = orderedUnique(all)
            return unique.filter { !$0.isReference } + unique.filter(\.isReference)
        }
        func latencyCase(_ title: String, _ figure: String, unit: String, rows: [LatencyResult], value: @escaping (LatencyResult) -> Double?) -> UseCase? {
            let candidates = ordered(rows.map { candidate($0.transport, $0.framing) })
            let here = placements.filter { placement in rows.contains { $0.placement == placement } }
            let values = candidates.map { candidate in
                here.map { placement in
                    rows.first { $0.placement == placement && $0.payloadBytes == 64 && candidate.matches($0.transport, $0.framing?.rawValue) }.flatMap(value)
                }
            }
            guard values.contains(where: { $0.contains { $0 != nil } }) else { return nil }
            return UseCase(title: title, figure: figure, unit: unit, lowerIsBetter: true, candidates: candidates, values: values, placements: here)
        }
        func streamCase(_ title: String, _ figure: String, unit: String, size: Int, value: @escaping (ThroughputResult) -> Double) -> UseCase? {
            let candidates = ordered(streams.map { candidate($0.transport, $0.framing) })
            let here = placements.filter { placement in streams.contains { $0.placement == placement } }
            let values = candidates.map { candidate in
                here.map { placement in
                    streams.first { $0.placement == placement && $0.payloadBytes == size && candidate.matches($0.transport, $0.framing?.rawValue) }.map(value)
                }
            }
            guard values.contains(where: { $0.contains { $0 != nil } }) else { return nil }
            return UseCase(title: title, figure: figure, unit: unit, lowerIsBetter: false, candidates: candidates, values: values, placements: here)
        }
        var cases: [UseCase?] = [
            latencyCase("Lowest latency, blocking waits", "Round trip p50 at 64 B, both processes sleeping in the kernel between messages.", unit: "µs", rows: blocking) { Double($0.p50) / 1000 },
            latencyCase("Lowest latency, spinning", "Round trip p50 at 64 B, both processes polling before they sleep (only with the processes on different cores).", unit: "µs", rows: spinning) { Double($0.p50) / 1000 },
            streamCase("Throughput, small messages", "One-way 64 B messages per second, timed until the receiver has taken them all.", unit: "k messages/s", size: 64) { $0.messagesPerSecond / 1000 },
            streamCase("Throughput, large messages", "One-way 1 MiB messages, payload megabytes per second.", unit: "MB/s", size: 1 << 20) { $0.bytesPerSecond / 1e6 },
            latencyCase("CPU per message", "CPU time of both processes (every thread, and a reference's daemon) per 64 B round trip.", unit: "µs", rows: blocking) { row in
                row.localCPUPerRoundTrip.flatMap { local in row.peerCPUPerRoundTrip.map { (local + $0) / 1000 } }
            },
        ]
        cases.append(peerDeathCase(results))
        return cases.compactMap { $0 }
    }

    /// The time from SIGKILL of the serving process to the client's invalidation (median of the
    /// trials); a reference system's client, killed under a loop of round trips, to its exit
    /// with the error it noticed. A system whose client noticed nothing is a note, not a value.
    static func peerDeathCase(_ results: RunResults) -> UseCase? {
        let noticed = results.invalidation.filter(\.noticed)
        guard !results.invalidation.isEmpty else { return nil }
        let candidates = noticed.map { Candidate(transport: $0.transport, framing: nil, isReference: $0.reference == true) }
        let values = noticed.map { [Double($0.median) / 1000] }
        var notes = results.invalidation.filter { !$0.noticed }.map { "\($0.transport): **not detected**; \($0.outcome ?? "its client noticed nothing")" }
        let measured = Set(results.invalidation.map(\.transport))
        // Spinning variants are not killed: their blocking variant's row answers for the system.
        notes += orderedUnique(results.latency.filter { ReferenceSystem.isReference($0.transport) && !$0.spins && !measured.contains($0.transport) }.map(\.transport))
            .map { "\($0): not measured in this run" }
        return UseCase(
            title: "When a peer dies",
            figure: "Time from SIGKILL of the serving process to the client's invalidation handler (an idle connection; median of the trials; unpinned). For a reference system, to its client's exit with the error it noticed, killed during a loop of 64 B round trips (the client's own exit included).",
            unit: "µs", lowerIsBetter: true, candidates: candidates, values: values, placements: [.unpinned], notes: notes
        )
    }

    /// The Markdown of the section: per use case, a table (candidates by placement, best first)
    /// and the verdict of each placement.
    public static func markdown(_ results: RunResults) -> String {
        let cases = useCases(results)
        let skipped = results.skippedReferences ?? []
        guard !cases.isEmpty || !skipped.isEmpty else { return "" }
        var text = "\n## Which should I use\n\n" + introduction(results) + "\n\n"
        for useCase in cases {
            text += "### \(useCase.title)\n\n\(useCase.figure)\n\n"
            let columns = ["transport or reference"] + useCase.placements.map { "\($0.rawValue) (\(useCase.unit))" }
            let rows = useCase.rankedRows().map { row in
                [useCase.candidates[row].label] + useCase.values[row].map { $0.map(SVGChart.format) ?? "-" }
            }
            text += ReportRenderer.markdownTable(columns, rows, leftAligned: 1)
            text += "\n" + (useCase.verdicts() + useCase.notes).map { "- \($0)\n" }.joined() + "\n"
        }
        if !skipped.isEmpty {
            text += "Not measured:\n\n" + ReportRenderer.skippedReferenceLines(skipped).map { "- " + $0 + "\n" }.joined()
        }
        return text
    }

    /// The HTML of the section: per use case, a bar chart (best first, one bar per placement),
    /// the verdicts and the table.
    public static func html(_ results: RunResults, label: String) -> String {
        let cases = useCases(results)
        let skipped = results.skippedReferences ?? []
        guard !cases.isEmpty || !skipped.isEmpty else { return "" }
        var html = "<h2>\(SVGChart.escape(label))Which should I use</h2>\n<p>\(SVGChart.escape(introduction(results)))</p>\n"
        for useCase in cases {
            html += "<h3>\(SVGChart.escape(useCase.title))</h3>\n<p>\(SVGChart.escape(useCase.figure))</p>\n"
            let series = useCase.placements.indices.map { column in
                SVGChart.Series(name: useCase.placements[column].rawValue, values: useCase.values.map { $0[column] }, family: .ours)
            }
            html += "<figure>" + SVGChart.rankedBars(title: useCase.title, rows: useCase.candidates.map(\.label), unit: useCase.unit, series: series, lowerIsBetter: useCase.lowerIsBetter) + "</figure>\n"
            html += "<ul>" + (useCase.verdicts() + useCase.notes).map { "<li>\(strong(SVGChart.escape($0)))</li>" }.joined() + "</ul>\n"
        }
        if !skipped.isEmpty {
            html += "<p>Not measured:</p><ul>" + ReportRenderer.skippedReferenceLines(skipped).map { "<li>\(SVGChart.escape($0))</li>" }.joined() + "</ul>\n"
        }
        return html
    }

    /// Markdown's `**bold**` as HTML.
    private static func strong(_ text: String) -> String {
        let parts = text.components(separatedBy: "**")
        return parts.enumerated().map { $0.offset % 2 == 1 ? "<strong>\($0.element)</strong>" : $0.element }.joined()
    }

    static func introduction(_ results: RunResults) -> String {
        let references = orderedUnique(results.latency.filter { ReferenceSystem.isReference($0.transport) }.map(\.transport))
        let compared = references.isEmpty
            ? "This run measured no reference system: `ipcbench run --references Benchmarks/References/.build/bin` (or `Scripts/bench.sh --references`) adds ZeroMQ, D-Bus, SwiftNIO, gRPC (Swift and C++) and iceoryx to every answer."
            : "Beside them, what a Linux or Swift developer would use instead, measured in the same run, sweeps, clock, histograms and placements: \(references.joined(separator: ", ")) (Benchmarks/References/README.md says what each is and how it is configured). Each reference checks every byte of every echo; its CPU time counts every process on the serving side (a daemon too)."
        return "Each use case below ranks this package's transports (their main rows: blocking unless the case is spinning, requests from the connection's executor, the peer serving with the default async handler) by the one figure that answers it, per placement, best first, and names the winner and its lead. " + compared
    }
}

extension ChoiceReport.UseCase {
    /// The candidates' indices, best first by the first placement with a value, unmeasured last.
    func rankedRows() -> [Int] {
        candidates.indices.sorted { a, b in
            func key(_ row: Int) -> Double? { values[row].lazy.compactMap { $0 }.first }
            switch (key(a), key(b)) {
            case let (x?, y?): return lowerIsBetter ? x < y : x > y
            case (.some, nil): return true
            default: return false
            }
        }
    }
}

extension ChoiceReport.Candidate {
    func matches(_ transport: String, _ framing: String?) -> Bool {
        self.transport == transport && self.framing == framing
    }
}

extension ReportRenderer {
    /// One line per reference system, mode and reason that was not measured, saying why: the
    /// payloads skipped for the same reason are listed in one line.
    public static func skippedReferenceLines(_ skipped: [SkippedReference]) -> [String] {
        var groups: [(key: SkippedReference, sizes: [Int])] = []
        for skip in skipped {
            var key = skip
            key.payloadBytes = nil
            if let index = groups.firstIndex(where: { $0.key == key }), let size = skip.payloadBytes, !groups[index].sizes.isEmpty {
                groups[index].sizes.append(size)
            } else {
                groups.append((key, skip.payloadBytes.map { [$0] } ?? []))
            }
        }
        return groups.map { group in
            let what = [group.key.mode, group.sizes.isEmpty ? nil : group.sizes.map(formatBytes).joined(separator: ", ")].compactMap { $0 }.joined(separator: " of ")
            return "skipped \(ReferenceSystem.prefix)\(group.key.system)\(what.isEmpty ? "" : " (\(what))"): \(group.key.reason)"
        }
    }
}
