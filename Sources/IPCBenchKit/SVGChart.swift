import Foundation

/// Charts as inline SVG, so a report is one self-contained page that needs no network and no
/// script to be read.
public enum SVGChart {
    public struct Series: Sendable {
        public var name: String
        /// One value per x position; `nil` where the series has no point.
        public var values: [Double?]

        public init(name: String, values: [Double?]) {
            self.name = name
            self.values = values
        }
    }

    static let palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]
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
        for (number, line) in series.enumerated() {
            let color = palette[number % palette.count]
            let points = line.values.enumerated().compactMap { index, value in value.map { (x(index), scale.y($0)) } }
            if points.count > 1 {
                svg += "<polyline fill=\"none\" stroke=\"\(color)\" stroke-width=\"2\" points=\"\(points.map { "\(f($0.0)),\(f($0.1))" }.joined(separator: " "))\"/>\n"
            }
            for (index, value) in line.values.enumerated() {
                guard let value else { continue }
                svg += "<circle cx=\"\(f(x(index)))\" cy=\"\(f(scale.y(value)))\" r=\"3.5\" fill=\"\(color)\" class=\"point\"><title>\(escape(line.name)) \(escape(xLabels[index])): \(format(value))</title></circle>\n"
            }
            svg += legend(number: number, name: line.name, color: color)
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
        for (number, bars) in series.enumerated() {
            let color = palette[number % palette.count]
            for (index, value) in bars.values.enumerated() {
                guard let value else { continue }
                let left = margin.left + group * Double(index) + group * 0.1 + bar * Double(number)
                let top = scale.y(value)
                svg += "<rect x=\"\(f(left))\" y=\"\(f(top))\" width=\"\(f(bar * 0.9))\" height=\"\(f(height - margin.bottom - top))\" fill=\"\(color)\" class=\"bar\"><title>\(escape(bars.name)) \(escape(xLabels[index])): \(format(value))</title></rect>\n"
            }
            svg += legend(number: number, name: bars.name, color: color)
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

    private static func legend(number: Int, name: String, color: String) -> String {
        let y = margin.top + Double(number) * 18
        let x = width - margin.right + 12
        return "<rect x=\"\(f(x))\" y=\"\(f(y - 9))\" width=\"12\" height=\"12\" fill=\"\(color)\"/><text x=\"\(f(x + 18))\" y=\"\(f(y + 1))\" class=\"legend\">\(escape(name))</text>\n"
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
