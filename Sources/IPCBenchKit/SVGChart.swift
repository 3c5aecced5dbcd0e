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

        var palette: [String] {
            switch self {
            case .ours: ["#08519c", "#2ca02c", "#17becf", "#3182bd", "#006d2c", "#6baed6", "#74c476"]
            case .floor: ["#252525", "#737373", "#969696", "#525252"]
            case .reference: ["#d62728", "#ff7f0e", "#9467bd", "#e377c2", "#8c564b", "#bcbd22"]
            }
        }
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
        return series.map { line in
            let number = counts[line.family, default: 0]
            counts[line.family] = number + 1
            let palette = line.family.palette
            return (palette[number % palette.count], Marker.allCases[(number / palette.count) % Marker.allCases.count])
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
    static let width = 720.0
    static let height = 360.0
    static let margin = (left: 70.0, right: 190.0, top: 40.0, bottom: 50.0)

    /// Lines over categorical x positions, with a logarithmic y axis when values span decades.
    public static func lines(title: String, xLabels: [String], yLabel: String, series: [Series]) -> String {
        let values = series.flatMap { $0.values.compactMap { $0 } }.filter { $0 > 0 }
        guard let low = values.min(), let high = values.max() else { return "" }
        let logarithmic = high / low > 20
        let scale = YScale(low: low, high: high, logarithmic: logarithmic)
        let plotWidth = width - margin.left - margin.right
        let step = xLabels.count > 1 ? plotWidth / Double(xLabels.count - 1) : 0
        func x(_ index: Int) -> Double { margin.left + (xLabels.count > 1 ? Double(index) * step : plotWidth / 2) }
        var svg = header(title: title, yLabel: yLabel, scale: scale)
        for (index, label) in xLabels.enumerated() {
            svg += "<text x=\"\(f(x(index)))\" y=\"\(f(height - margin.bottom + 18))\" text-anchor=\"middle\" class=\"tick\">\(escape(label))</text>\n"
        }
        let styles = styles(series)
        for (number, line) in series.enumerated() {
            let (color, shape) = styles[number]
            let points = line.values.enumerated().compactMap { index, value in value.map { (x(index), scale.y($0)) } }
            if points.count > 1 {
                svg += "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\" points=\"\(points.map { "\(f($0.0)),\(f($0.1))" }.joined(separator: " "))\"/>\n"
            }
            for (index, value) in line.values.enumerated() {
                guard let value else { continue }
                svg += marker(shape, x: x(index), y: scale.y(value), color: color, title: "\(line.name) \(xLabels[index]): \(format(value))")
            }
            svg += legend(number: number, name: line.name, color: color, marker: shape)
        }
        return svg + "</svg>\n"
    }

    /// Grouped bars: one group per x label, one bar per series.
    public static func bars(title: String, xLabels: [String], yLabel: String, series: [Series], reference: Double? = nil) -> String {
        let values = series.flatMap { $0.values.compactMap { $0 } } + (reference.map { [$0] } ?? [])
        guard let high = values.max(), high > 0 else { return "" }
        let scale = YScale(low: 0, high: high, logarithmic: false)
        let plotWidth = width - margin.left - margin.right
        let group = plotWidth / Double(max(1, xLabels.count))
        let bar = group * 0.8 / Double(max(1, series.count))
        var svg = header(title: title, yLabel: yLabel, scale: scale)
        for (index, label) in xLabels.enumerated() {
            svg += "<text x=\"\(f(margin.left + group * (Double(index) + 0.5)))\" y=\"\(f(height - margin.bottom + 18))\" text-anchor=\"middle\" class=\"tick\">\(escape(label))</text>\n"
        }
        let styles = styles(series)
        for (number, bars) in series.enumerated() {
            let (color, shape) = styles[number]
            for (index, value) in bars.values.enumerated() {
                guard let value else { continue }
                let left = margin.left + group * Double(index) + group * 0.1 + bar * Double(number)
                let top = scale.y(value)
                svg += "<rect x=\"\(f(left))\" y=\"\(f(top))\" width=\"\(f(bar * 0.9))\" height=\"\(f(height - margin.bottom - top))\" fill=\"\(color)\" class=\"bar\"><title>\(escape(bars.name)) \(escape(xLabels[index])): \(format(value))</title></rect>\n"
            }
            svg += legend(number: number, name: bars.name, color: color, marker: shape)
        }
        if let reference {
            let y = scale.y(reference)
            svg += "<line x1=\"\(f(margin.left))\" x2=\"\(f(width - margin.right))\" y1=\"\(f(y))\" y2=\"\(f(y))\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n"
        }
        return svg + "</svg>\n"
    }

    private struct YScale {
        let low: Double
        let high: Double
        let logarithmic: Bool

        init(low: Double, high: Double, logarithmic: Bool) {
            if logarithmic {
                self.low = pow(10, floor(log10(low)))
                self.high = pow(10, ceil(log10(high)))
            } else {
                self.low = 0
                self.high = high * 1.1
            }
            self.logarithmic = logarithmic
        }

        func y(_ value: Double) -> Double {
            let top = SVGChart.margin.top
            let bottom = SVGChart.height - SVGChart.margin.bottom
            let fraction = logarithmic ? (log10(max(value, low)) - log10(low)) / (log10(high) - log10(low)) : (value - low) / (high - low)
            return bottom - fraction * (bottom - top)
        }

        var ticks: [Double] {
            if logarithmic {
                return stride(from: log10(low), through: log10(high), by: 1).map { pow(10, $0) }
            }
            return (0...4).map { high * Double($0) / 4 }
        }
    }

    private static func header(title: String, yLabel: String, scale: YScale) -> String {
        var svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" viewBox=\"0 0 \(Int(width)) \(Int(height))\" width=\"\(Int(width))\" height=\"\(Int(height))\" role=\"img\" aria-label=\"\(escape(title))\">\n"
        svg += "<text x=\"\(f(width / 2 - margin.right / 2))\" y=\"22\" text-anchor=\"middle\" class=\"title\">\(escape(title))</text>\n"
        svg += "<text transform=\"translate(16 \(f(height / 2))) rotate(-90)\" text-anchor=\"middle\" class=\"axis\">\(escape(yLabel))\(scale.logarithmic ? " (log scale)" : "")</text>\n"
        for tick in scale.ticks {
            let y = scale.y(tick)
            svg += "<line x1=\"\(f(margin.left))\" x2=\"\(f(width - margin.right))\" y1=\"\(f(y))\" y2=\"\(f(y))\" class=\"grid\"/>\n"
            svg += "<text x=\"\(f(margin.left - 6))\" y=\"\(f(y + 4))\" text-anchor=\"end\" class=\"tick\">\(format(tick))</text>\n"
        }
        return svg
    }

    private static func legend(number: Int, name: String, color: String, marker shape: Marker) -> String {
        let y = margin.top + Double(number) * 18
        let x = width - margin.right + 12
        return marker(shape, x: x + 6, y: y - 3, color: color, title: name)
            + "<text x=\"\(f(x + 18))\" y=\"\(f(y + 1))\" class=\"legend\">\(escape(name))</text>\n"
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
