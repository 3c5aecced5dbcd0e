import Foundation

/// Compares two result files measurement by measurement, in a way suited to noisy machines: a
/// change counts only if it is large enough to matter (``minimumChange``), unlikely to be noise
/// by a two-sided Mann–Whitney U test over the two runs' repetition medians, and clear of the
/// spread (the interquartile ranges of the two runs' repetitions do not overlap).
///
/// Runs from different machines are compared by ``Basis/ratioToFloor``: each measurement's
/// repetitions divided by its native floor's repetitions from the same run (measured in the
/// same sweeps, so drift hits both alike). A machine that runs user code slower moves these
/// ratios; one whose kernel is slower moves the floor and the transport alike.
public struct Comparison: Sendable {
    /// What is compared.
    public enum Basis: String, Sendable, Codable {
        /// Nanoseconds: latency, and time per message for throughput. Same machine only.
        case absolute
        /// Each measurement as a multiple of its native floor in the same run.
        case ratioToFloor
    }

    public enum Verdict: String, Sendable, Codable {
        case regression, improvement, unchanged
        /// Too few repetitions to test (fewer than 3 on either side).
        case inconclusive
    }

    public struct Row: Sendable, Codable {
        public var name: String
        public var baselineMedian: Double
        public var currentMedian: Double
        /// `current / baseline - 1`.
        public var change: Double
        public var pValue: Double?
        public var verdict: Verdict
    }

    public var basis: Basis
    public var rows: [Row]
    /// Measurements present in only one of the files.
    public var unmatched: [String]
    /// Measurements that have no native floor to divide by (with ``Basis/ratioToFloor``).
    public var withoutFloor: [String]

    public var hasRegression: Bool { rows.contains { $0.verdict == .regression } }

    /// - Parameters:
    ///   - alpha: the significance level of the U test.
    ///   - minimumChange: the smallest relative change of the median that can count (0.2 = 20 %).
    public init(baseline: RunResults, current: RunResults, alpha: Double, minimumChange: Double, basis: Basis = .absolute) {
        self.basis = basis
        let (baselineMeasurements, baselineWithoutFloor) = Self.measurements(baseline, basis: basis)
        let (now, currentWithoutFloor) = Self.measurements(current, basis: basis)
        let before = Dictionary(baselineMeasurements, uniquingKeysWith: { first, _ in first })
        withoutFloor = Set(baselineWithoutFloor).union(currentWithoutFloor).sorted()
        unmatched = Set(before.keys).symmetricDifference(now.map(\.name)).sorted()
        rows = now.compactMap { name, currentValues in
            guard let baselineValues = before[name] else { return nil }
            let baselineMedian = Self.median(baselineValues)
            let currentMedian = Self.median(currentValues)
            let change = baselineMedian > 0 ? currentMedian / baselineMedian - 1 : 0
            let pValue = Self.mannWhitneyU(baselineValues, currentValues)
            let verdict: Verdict
            let (thenLow, thenHigh) = Self.quartiles(baselineValues)
            let (nowLow, nowHigh) = Self.quartiles(currentValues)
            if let pValue {
                if pValue < alpha, change > minimumChange, nowLow > thenHigh {
                    verdict = .regression
                } else if pValue < alpha, change < -minimumChange, nowHigh < thenLow {
                    verdict = .improvement
                } else {
                    verdict = .unchanged
                }
            } else {
                verdict = .inconclusive
            }
            return Row(name: name, baselineMedian: baselineMedian, currentMedian: currentMedian, change: change, pValue: pValue, verdict: verdict)
        }
    }

    /// Every measurement's repetitions, where more is worse: round-trip medians for latency,
    /// nanoseconds per message (the inverse of the rate) for throughput; with
    /// ``Basis/ratioToFloor`` each divided by its floor's repetition of the same index (the
    /// floors themselves are left out, and so are the measurements without a floor, which are
    /// returned apart).
    static func measurements(_ results: RunResults, basis: Basis) -> (measurements: [(name: String, values: [Double])], withoutFloor: [String]) {
        let throughput = results.throughput ?? []
        func perMessage(_ result: ThroughputResult) -> [Double] {
            result.repetitionMessagesPerSecond.map { $0 > 0 ? 1e9 / $0 : .infinity }
        }
        guard basis == .ratioToFloor else {
            return (results.latency.map { ($0.name, $0.repetitionMedians.map { Double($0) }) } + throughput.map { ($0.name, perMessage($0)) }, [])
        }
        var measurements: [(name: String, values: [Double])] = []
        var withoutFloor: [String] = []
        func divide(_ values: [Double], by floor: [Double]) -> [Double] {
            // Repetition i of the transport and of its floor ran in the same sweep.
            guard values.count == floor.count else { return values.map { $0 / max(.leastNonzeroMagnitude, median(floor)) } }
            return zip(values, floor).map { $0 / max(.leastNonzeroMagnitude, $1) }
        }
        for result in results.latency where !result.transport.hasPrefix("floor:") {
            guard let floor = result.floor(in: results.latency) else {
                withoutFloor.append(result.name)
                continue
            }
            measurements.append((result.name, divide(result.repetitionMedians.map { Double($0) }, by: floor.repetitionMedians.map { Double($0) })))
        }
        for result in throughput where !result.transport.hasPrefix("floor:") {
            guard let floor = result.floor(in: throughput) else {
                withoutFloor.append(result.name)
                continue
            }
            measurements.append((result.name, divide(perMessage(result), by: perMessage(floor))))
        }
        return (measurements, withoutFloor)
    }

    static func median(_ values: [Double]) -> Double {
        guard !values.isEmpty else { return 0 }
        let sorted = values.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// The first and third quartiles (nearest rank).
    static func quartiles(_ values: [Double]) -> (Double, Double) {
        guard !values.isEmpty else { return (0, 0) }
        let sorted = values.sorted()
        return (sorted[(sorted.count - 1) / 4], sorted[(3 * (sorted.count - 1) + 3) / 4])
    }

    /// Two-sided p-value of the Mann–Whitney U test, normal approximation with tie correction
    /// (adequate from about 5 values a side; `nil` below 3).
    static func mannWhitneyU(_ first: [Double], _ second: [Double]) -> Double? {
        let n1 = Double(first.count)
        let n2 = Double(second.count)
        guard n1 >= 3, n2 >= 3 else { return nil }
        let all = (first.map { ($0, 0) } + second.map { ($0, 1) }).sorted { $0.0 < $1.0 }
        var ranks = [Double](repeating: 0, count: all.count)
        var tieTerm = 0.0
        var start = 0
        while start < all.count {
            var end = start
            while end + 1 < all.count, all[end + 1].0 == all[start].0 { end += 1 }
            let rank = Double(start + end) / 2 + 1
            for index in start...end { ranks[index] = rank }
            let ties = Double(end - start + 1)
            tieTerm += ties * ties * ties - ties
            start = end + 1
        }
        let rankSum = zip(all, ranks).filter { $0.0.1 == 0 }.reduce(0) { $0 + $1.1 }
        let u = rankSum - n1 * (n1 + 1) / 2
        let mean = n1 * n2 / 2
        let n = n1 + n2
        let variance = n1 * n2 / 12 * ((n + 1) - tieTerm / (n * (n - 1)))
        guard variance > 0 else { return 1 }
        let z = (abs(u - mean) - 0.5) / variance.squareRoot()
        return min(1, erfc(max(0, z) / 2.0.squareRoot()))
    }

    /// A fixed-width table.
    public func table() -> String {
        let header = ["measurement", basis == .absolute ? "baseline" : "baseline ÷ floor", basis == .absolute ? "current" : "current ÷ floor", "change", "p", "verdict"]
        func format(_ value: Double) -> String {
            basis == .absolute ? formatMicroseconds(UInt64(value)) : String(format: "%.2f×", value)
        }
        let cells: [[String]] = rows.map { row in
            [row.name, format(row.baselineMedian), format(row.currentMedian),
             String(format: "%+.1f%%", row.change * 100), row.pValue.map { String(format: "%.4f", $0) } ?? "-", row.verdict.rawValue]
        }
        let all = [header] + cells
        let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
        var lines = all.map { row in
            row.enumerated().map { column, cell in
                let padding = String(repeating: " ", count: widths[column] - cell.count)
                return column == 0 || column == 5 ? cell + padding : padding + cell
            }.joined(separator: "  ")
        }
        lines += unmatched.map { "\($0): only in one file" }
        lines += withoutFloor.map { "\($0): no native floor to divide by; not comparable across machines" }
        return lines.joined(separator: "\n") + "\n"
    }
}
