import Foundation
import IPCConformance
import IPCBenchKit
import IPCTestSupport
import Testing
import IPCCore

/// The HTML report is rendered by a real browser, headless Chromium from Debian
/// (Scripts/install-system-packages.sh installs it), and the charts are checked to be drawn:
/// every chart has a non-empty box on the page, and its lines, points and bars have sizes.
@Suite("HTML report in headless Chromium")
struct HTMLReportTests {
    static let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first { FileManager.default.isExecutableFile(atPath: $0) }

    @Test("every chart is drawn")
    func chartsAreDrawn() throws {
        let browser = try #require(Self.chromium, "headless Chromium is not installed; run Scripts/install-system-packages.sh")
        let group = try TestGroup()
        let html = HTMLReport.render([(label: "fixture", results: ReportFixtures.results(scale: 1, references: true))])
        // Measure what the browser laid out, and write the counts into the DOM for --dump-dom.
        let probe = """
        <script>
        window.addEventListener('load', () => {
          const charts = [...document.querySelectorAll('svg.chart')];
          const drawn = charts.filter(svg => { const box = svg.getBoundingClientRect(); return box.width > 100 && box.height > 100; });
          const marks = [...document.querySelectorAll('svg.chart polyline, svg.chart .point, svg.chart rect.bar')]
            .filter(mark => { const box = mark.getBBox(); return box.width > 0 || box.height > 0; });
          document.body.setAttribute('data-charts', charts.length);
          document.body.setAttribute('data-drawn', drawn.length);
          document.body.setAttribute('data-marks', marks.length);
        });
        </script>
        """
        let page = group.directory.path + "/report.html"
        try Data(html.replacingOccurrences(of: "</body>", with: probe + "</body>").utf8).write(to: URL(fileURLWithPath: page))
        let process = Process()
        process.executableURL = URL(fileURLWithPath: browser)
        process.arguments = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--user-data-dir=\(group.directory.path)/profile", "--dump-dom", "file://\(page)"]
        process.standardError = FileHandle.nullDevice
        let output = try ChildProcess.run(process, output: true).output!
        let dom = String(decoding: output.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        func attribute(_ name: String) -> Int? {
            guard let range = dom.range(of: "\(name)=\"") else { return nil }
            return Int(dom[range.upperBound...].prefix { $0.isNumber })
        }
        let charts = try #require(attribute("data-charts"), "the page did not run its probe; chromium said: \(dom.prefix(300))")
        // Two placements × (which should I use: round trips, 64 B stream, 1 MiB stream, CPU;
        // p50, p99, ratio to floor, latency by percentile) + scale (alone against loaded) +
        // invalidation.
        #expect(charts == 20)
        #expect(attribute("data-drawn") == charts)
        #expect((attribute("data-marks") ?? 0) > 50)
    }

    @Test("the percentile plot has one line per transport's main row, at most 8, from p50 to the maximum, rising")
    func percentilePlot() throws {
        let results = ReportFixtures.results(scale: 1, references: true)
        let rows = results.latency.map { (label: "", result: $0) }
        for placement in Set(results.latency.map(\.placement)) {
            let chart = HTMLReport.percentileChart(rows.filter { $0.result.placement == placement }, placement: placement)
            #expect(chart.contains("Latency by percentile"), "\(placement)")
            for label in ["p50 (2)", "p90 (10)", "p99 (100)", "p99.9 (1,000)", "max"] { #expect(chart.contains(label)) }
            let lines = chart.components(separatedBy: "<polyline").count - 1
            #expect((1...8).contains(lines), "\(placement): \(lines) lines")
            #expect(!chart.contains("floor:") && !chart.contains("ref:"), "floors and references are not main rows")
        }
    }

    @Test("the page is self-contained: no external resources")
    func selfContained() {
        let html = HTMLReport.render([(label: "fixture", results: ReportFixtures.results(scale: 1))])
        #expect(!html.contains("http://") || html.components(separatedBy: "http://").dropFirst().allSatisfy { $0.hasPrefix("www.w3.org/2000/svg") })
        #expect(!html.contains("https://"))
        #expect(!html.contains("<script"))
    }
}
