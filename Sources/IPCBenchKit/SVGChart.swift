import Foundation

/// Charts as inline SVG, so a report is one self-contained page that needs no network and no
/// script to be read.
public enum SVGChart {
    public struct Series: Sendable {
        public var name: String
        /// One value per x position; `nil` where the series has no point.
        public var values: [Double?]
        /// Whose measurement it is, which sets its colours (``Family``).
        public var family: Family

        /// `family` defaults to what the name says: a name containing `floor:` is a floor's,
        /// `ref:` a reference system's, anything else one of ours.
        public init(name: String, values: [Double?], family: Family? = nil) {
            self.name = name
            self.values = values
            self.family = family ?? Family(seriesName: name)
        }
    }

    /// Who a series measures. Each family has colours of its own — ours blues and greens, floors
    /// greys, reference systems warm colours — and within a chart every series gets a colour and
    /// marker pair of its own.
    public enum Family: Sendable, CaseIterable {
        case ours, floor, reference

        init(seriesName name: String) {
            self = name.contains("floor:") ? .floor : name.contains(ReferenceSystem.prefix) ? .reference : .ours
        }

        /// Ours and the references take distinct hues of the Okabe–Ito and Tol palettes (cool for
        /// ours, warm for references), floors black and greys, drawn dashed.
        var palette: [String] {
            switch self {
            case .ours: ["#0072B2", "#009E73", "#CC79A7", "#56B4E9", "#882255", "#117733"]
            case .floor: ["#000000", "#777777", "#AAAAAA", "#444444"]
            case .reference: ["#D55E00", "#E69F00", "#AA4499", "#DDCC77"]
            }
        }

        /// A floor's line is dashed, so that it reads as a bound, not a competitor.
        var dash: String { self == .floor ? " stroke-dasharray=\"5 3\"" : "" }
    }

    /// Okabe and Ito's colour-blind-safe palette (black left out: it is the floors' colour).
    static let okabeIto = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]

    /// The shapes that tell apart series of one colour.
    enum Marker: CaseIterable { case circle, square, triangle, diamond }

    /// The colour and marker of each series, in order: within a family, colours first, then the
    /// next marker with the colours again, so no two series of a chart share both.
    static func styles(_ series: [Series]) -> [(color: String, marker: Marker)] {
        // A chart of one family (the percentile plot, a transport-only chart) needs no family
        // colours: each series gets a colour of the Okabe–Ito palette, which stays distinct for
        // colour-blind readers, and a marker of its own.
        if Set(series.map(\.family)).count == 1, series.count <= okabeIto.count {
            return series.indices.map { (okabeIto[$0], Marker.allCases[$0 % Marker.allCases.count]) }
        }
        var counts: [Family: Int] = [:]
        return series.enumerated().map { index, line in
            let number = counts[line.family, default: 0]
            counts[line.family] = number + 1
            let palette = line.family.palette
            return (palette[number % palette.count], Marker.allCases[index % Marker.allCases.count])
        }
    }

    /// A marker's SVG at (x, y), with a tooltip.
    static func marker(_ marker: Marker, x: Double, y: Double, color: String, title: String) -> String {
        let shape: String
        switch marker {
        case .circle:
            shape = "<circle cx=\"\(f(x))\" cy=\"\(f(y))\" r=\"3.5\" fill=\"\(color)\" class=\"point\">"
            return shape + "<title>\(escape(title))</title></circle>\n"
        case .square:
            shape = "<rect x=\"\(f(x - 3.5))\" y=\"\(f(y - 3.5))\" width=\"7\" height=\"7\" fill=\"\(color)\" class=\"point\">"
            return shape + "<title>\(escape(title))</title></rect>\n"
        case .triangle:
            shape = "<polygon points=\"\(f(x)),\(f(y - 4.5)) \(f(x - 4)),\(f(y + 3.5)) \(f(x + 4)),\(f(y + 3.5))\" fill=\"\(color)\" class=\"point\">"
            return shape + "<title>\(escape(title))</title></polygon>\n"
        case .diamond:
            shape = "<polygon points=\"\(f(x)),\(f(y - 4.5)) \(f(x - 4.5)),\(f(y)) \(f(x)),\(f(y + 4.5)) \(f(x + 4.5)),\(f(y))\" fill=\"\(color)\" class=\"point\">"
            return shape + "<title>\(escape(title))</title></polygon>\n"
        }
    }
    /// The width of a full-width chart; a small multiple is ``smallWidth``.
    public static let fullWidth = 720.0
    /// The width of a small multiple: two fit side by side in the page.
    public static let smallWidth = 460.0
    static let plotHeight = 240.0
    static let margin = (left: 64.0, right: 16.0, top: 36.0, axis: 28.0)
    /// The legend's rows, below the plot: a marker, the name, and a gap, wrapped at the width.
    static let legendRow = 18.0
    /// An upper bound of the width of one character of the legend's 11 px font (system-ui), so
    /// that a legend laid out here never runs into the next entry or past the chart's edge.
    static let legendCharacterWidth = 6.6

    /// Where each legend entry goes, and the chart's height with the legend below the plot.
    struct Layout {
        let width: Double
        let entries: [(x: Double, y: Double)]
        let height: Double

        init(width: Double, names: [String]) {
            self.width = width
            let left = 8.0
            let right = width - 8
            var x = left
            var row = 0
            var entries: [(x: Double, y: Double)] = []
            for name in names {
                let entryWidth = 18 + Double(name.count) * SVGChart.legendCharacterWidth + 14
                if x > left, x + entryWidth > right {
                    row += 1
                    x = left
                }
                entries.append((x, SVGChart.margin.top + SVGChart.plotHeight + SVGChart.margin.axis + 14 + Double(row) * SVGChart.legendRow))
                x += entryWidth
            }
            self.entries = entries
            height = SVGChart.margin.top + SVGChart.plotHeight + SVGChart.margin.axis + (names.isEmpty ? 8 : Double(row + 1) * SVGChart.legendRow + 12)
        }

        var plotBottom: Double { SVGChart.margin.top + SVGChart.plotHeight }
        var plotRight: Double { width - SVGChart.margin.right }
    }

    /// Lines over categorical x positions, with a logarithmic y axis when values span decades.
    public static func lines(title: String, xLabels: [String], yLabel: String, series: [Series], width: Double = fullWidth) -> String {
        let values = series.flatMap { $0.values.compactMap { $0 } }.filter { $0 > 0 }
        guard let low = values.min(), let high = values.max() else { return "" }
        let logarithmic = high / low > 20
        let layout = Layout(width: width, names: series.map(\.name))
        let scale = YScale(low: low, high: high, logarithmic: logarithmic, layout: layout)
        let inset = 16.0
        let plotWidth = layout.plotRight - margin.left - 2 * inset
        let step = xLabels.count > 1 ? plotWidth / Double(xLabels.count - 1) : 0
        func x(_ index: Int) -> Double { margin.left + inset + (xLabels.count > 1 ? Double(index) * step : plotWidth / 2) }
        var svg = header(title: title, yLabel: yLabel, scale: scale, layout: layout)
        for (index, label) in xLabels.enumerated() {
            svg += "<text x=\"\(f(x(index)))\" y=\"\(f(layout.plotBottom + 18))\" text-anchor=\"middle\" class=\"tick\">\(escape(label))</text>\n"
        }
        let styles = styles(series)
        for (number, line) in series.enumerated() {
            let (color, shape) = styles[number]
            let points = line.values.enumerated().compactMap { index, value in value.map { (x(index), scale.y($0)) } }
            if points.count > 1 {
                svg += "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\"\(line.family.dash) points=\"\(points.map { "\(f($0.0)),\(f($0.1))" }.joined(separator: " "))\"/>\n"
            }
            for (index, value) in line.values.enumerated() {
                guard let value else { continue }
                svg += marker(shape, x: x(index), y: scale.y(value), color: color, title: "\(line.name) \(xLabels[index]): \(format(value))")
            }
            svg += legend(layout.entries[number], name: line.name, color: color, marker: shape)
        }
        return svg + "</svg>\n"
    }

    /// Grouped bars: one group per x label, one bar per series.
    public static func bars(title: String, xLabels: [String], yLabel: String, series: [Series], reference: Double? = nil, width: Double = fullWidth) -> String {
        let values = series.flatMap { $0.values.compactMap { $0 } } + (reference.map { [$0] } ?? [])
        guard let high = values.max(), high > 0 else { return "" }
        let layout = Layout(width: width, names: series.map(\.name))
        let scale = YScale(low: 0, high: high, logarithmic: false, layout: layout)
        let plotWidth = layout.plotRight - margin.left
        let group = plotWidth / Double(max(1, xLabels.count))
        let bar = group * 0.8 / Double(max(1, series.count))
        var svg = header(title: title, yLabel: yLabel, scale: scale, layout: layout)
        for (index, label) in xLabels.enumerated() {
            svg += "<text x=\"\(f(margin.left + group * (Double(index) + 0.5)))\" y=\"\(f(layout.plotBottom + 18))\" text-anchor=\"middle\" class=\"tick\">\(escape(label))</text>\n"
        }
        let styles = styles(series)
        for (number, bars) in series.enumerated() {
            let (color, shape) = styles[number]
            for (index, value) in bars.values.enumerated() {
                guard let value else { continue }
                let left = margin.left + group * Double(index) + group * 0.1 + bar * Double(number)
                let top = scale.y(value)
                svg += "<rect x=\"\(f(left))\" y=\"\(f(top))\" width=\"\(f(bar * 0.9))\" height=\"\(f(layout.plotBottom - top))\" fill=\"\(color)\" class=\"bar\"><title>\(escape(bars.name)) \(escape(xLabels[index])): \(format(value))</title></rect>\n"
            }
            svg += legend(layout.entries[number], name: bars.name, color: color, marker: shape)
        }
        if let reference {
            let y = scale.y(reference)
            svg += "<line x1=\"\(f(margin.left))\" x2=\"\(f(layout.plotRight))\" y1=\"\(f(y))\" y2=\"\(f(y))\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n"
        }
        return svg + "</svg>\n"
    }

    /// Horizontal bars, one row per candidate (its name at the left, best first), one bar per
    /// series in each row (at most a few: the placements), its value at the bar's end. A
    /// logarithmic axis when the values span more than 20×, so that the fast candidates stay
    /// readable beside ones 100× slower. `lowerIsBetter` orders the rows.
    public static func rankedBars(title: String, rows: [String], unit: String, series: [Series], lowerIsBetter: Bool) -> String {
        let values = series.flatMap { $0.values.compactMap { $0 } }.filter { $0 > 0 }
        guard let low = values.min(), let high = values.max() else { return "" }
        // Best first by the first series with a value, rows with no value last.
        let order = rows.indices.sorted { a, b in
            func key(_ row: Int) -> Double? { series.lazy.compactMap { $0.values[row] }.first }
            switch (key(a), key(b)) {
            case let (x?, y?): return lowerIsBetter ? x < y : x > y
            case (.some, nil): return true
            default: return false
            }
        }
        let logarithmic = high / low > 20
        let lowEnd = logarithmic ? pow(10, Foundation.floor(log10(low))) : 0
        let highEnd = logarithmic ? pow(10, ceil(log10(high))) : niceTicks(upTo: high * 1.1).last!
        let labelWidth = min(260, Double(rows.map(\.count).max() ?? 0) * legendCharacterWidth + 12)
        let width = fullWidth
        let left = labelWidth
        let right = width - 56
        let bar = 9.0
        let rowHeight = bar * Double(series.count) + 8
        let top = margin.top
        let plotHeight = rowHeight * Double(rows.count)
        func x(_ value: Double) -> Double {
            let fraction = logarithmic ? (log10(max(value, lowEnd)) - log10(lowEnd)) / (log10(highEnd) - log10(lowEnd)) : value / highEnd
            return left + fraction * (right - left)
        }
        let names = series.map(\.name)
        var legendX = 8.0
        let legendY = top + plotHeight + 40
        let height = legendY + 16
        var svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" width=\"\(Int(width))\" height=\"\(Int(height))\" role=\"img\" aria-label=\"\(escape(title))\">\n"
        svg += "<text x=\"\(f(width / 2))\" y=\"22\" text-anchor=\"middle\" class=\"title\">\(escape(title))</text>\n"
        let ticks = logarithmic ? stride(from: log10(lowEnd), through: log10(highEnd), by: 1).map { pow(10, $0) } : niceTicks(upTo: high * 1.1)
        for tick in ticks {
            svg += "<line x1=\"\(f(x(tick)))\" x2=\"\(f(x(tick)))\" y1=\"\(f(top))\" y2=\"\(f(top + plotHeight))\" class=\"grid\"/>\n"
            svg += "<text x=\"\(f(x(tick)))\" y=\"\(f(top + plotHeight + 14))\" text-anchor=\"middle\" class=\"tick\">\(format(tick))</text>\n"
        }
        svg += "<text x=\"\(f((left + right) / 2))\" y=\"\(f(top + plotHeight + 28))\" text-anchor=\"middle\" class=\"axis\">\(escape(unit))\(logarithmic ? " (log scale)" : "")\(lowerIsBetter ? ", lower is better" : ", higher is better")</text>\n"
        let styles = styles(series.map { Series(name: $0.name, values: $0.values, family: .ours) })
        for (position, row) in order.enumerated() {
            let y = top + Double(position) * rowHeight + 4
            svg += "<text x=\"\(f(left - 6))\" y=\"\(f(y + rowHeight / 2))\" text-anchor=\"end\" class=\"tick\">\(escape(rows[row]))</text>\n"
            for (number, line) in series.enumerated() {
                guard let value = line.values[row] else { continue }
                let barY = y + Double(number) * bar
                svg += "<rect x=\"\(f(left))\" y=\"\(f(barY))\" width=\"\(f(max(1, x(value) - left)))\" height=\"\(f(bar - 1))\" fill=\"\(styles[number].color)\" class=\"bar\"><title>\(escape(rows[row])) \(escape(line.name)): \(format(value)) \(escape(unit))</title></rect>\n"
                svg += "<text x=\"\(f(x(value) + 3))\" y=\"\(f(barY + bar - 1.5))\" class=\"value\">\(format(value))</text>\n"
            }
        }
        for (number, name) in names.enumerated() {
            svg += legend((legendX, legendY), name: name, color: styles[number].color, marker: .square)
            legendX += 18 + Double(name.count) * legendCharacterWidth + 14
        }
        return svg + "</svg>\n"
    }

    private struct YScale {
        let low: Double
        let high: Double
        let logarithmic: Bool
        let top: Double
        let bottom: Double

        init(low: Double, high: Double, logarithmic: Bool, layout: Layout) {
            if logarithmic {
                self.low = pow(10, Foundation.floor(log10(low)))
                self.high = pow(10, ceil(log10(high)))
            } else {
                self.low = 0
                self.high = SVGChart.niceTicks(upTo: high).last!
            }
            self.logarithmic = logarithmic
            top = SVGChart.margin.top
            bottom = layout.plotBottom
        }

        func y(_ value: Double) -> Double {
            let fraction = logarithmic ? (log10(max(value, low)) - log10(low)) / (log10(high) - log10(low)) : (value - low) / (high - low)
            return bottom - fraction * (bottom - top)
        }

        var ticks: [Double] {
            if logarithmic {
                return stride(from: log10(low), through: log10(high), by: 1).map { pow(10, $0) }
            }
            return SVGChart.niceTicks(upTo: high)
        }
    }

    /// Ticks from 0 at a round step (1, 2 or 5 times a power of ten), about four of them, the
    /// last at or above `high` with a little room.
    static func niceTicks(upTo high: Double) -> [Double] {
        guard high.isFinite, high > 1e-300 else { return [0, 1] }
        let raw = max(high * 1.05, .leastNonzeroMagnitude) / 4
        let magnitude = pow(10, Foundation.floor(log10(raw)))
        let step = [1.0, 2, 2.5, 5, 10].first { $0 * magnitude >= raw }! * magnitude
        let count = Int(ceil(high * 1.05 / step))
        return (0...max(1, count)).map { Double($0) * step }
    }

    private static func header(title: String, yLabel: String, scale: YScale, layout: Layout) -> String {
        var svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 \(Int(layout.width)) \(Int(layout.height))\" width=\"\(Int(layout.width))\" height=\"\(Int(layout.height))\" role=\"img\" aria-label=\"\(escape(title))\">\n"
        svg += "<text x=\"\(f(layout.width / 2))\" y=\"22\" text-anchor=\"middle\" class=\"title\">\(escape(title))</text>\n"
        svg += "<text transform=\"translate(16 \(f((scale.top + scale.bottom) / 2))) rotate(-90)\" text-anchor=\"middle\" class=\"axis\">\(escape(yLabel))\(scale.logarithmic ? " (log)" : "")</text>\n"
        for tick in scale.ticks {
            let y = scale.y(tick)
            svg += "<line x1=\"\(f(margin.left))\" x2=\"\(f(layout.plotRight))\" y1=\"\(f(y))\" y2=\"\(f(y))\" class=\"grid\"/>\n"
            svg += "<text x=\"\(f(margin.left - 6))\" y=\"\(f(y + 4))\" text-anchor=\"end\" class=\"tick\">\(format(tick))</text>\n"
        }
        return svg
    }

    /// One legend entry: its marker and name, in a group the browser test measures.
    private static func legend(_ position: (x: Double, y: Double), name: String, color: String, marker shape: Marker) -> String {
        "<g class=\"legend-entry\">" + marker(shape, x: position.x + 6, y: position.y - 4, color: color, title: name)
            + "<text x=\"\(f(position.x + 16))\" y=\"\(f(position.y))\" class=\"legend\">\(escape(name))</text></g>\n"
    }

    static func format(_ value: Double) -> String {
        if value >= 100 || value == value.rounded() { return String(format: "%.0f", value) }
        if value >= 10 { return String(format: "%.1f", value) }
        if value >= 0.01 { return String(format: "%.2f", value) }
        return String(format: "%.1g", value)
    }

    private static func f(_ value: Double) -> String { String(format: "%.1f", value) }

    static func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }
}
