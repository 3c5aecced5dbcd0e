import Foundation
import IPCConformance
import IPCBenchKit
import IPCTestSupport
import Testing
import IPCCore
import IPCFraming

/// The HTML report is rendered by a real browser, headless Chromium from Debian
/// (Scripts/install-system-packages.sh installs it), and the charts are checked to be drawn:
/// every chart has a non-empty box on the page, and its lines, points and bars have sizes.
@Suite("HTML report in headless Chromium")
struct HTMLReportTests {
    static let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].first { FileManager.default.isExecutableFile(atPath: $0) }

    /// Renders `html` in headless Chromium with a probe that writes what it measured into the
    /// page's attributes, and returns them.
    static func browserMeasures(_ html: String) throws -> [String: Int] {
        let browser = try #require(Self.chromium, "headless Chromium is not installed; run Scripts/install-system-packages.sh")
        let group = try TestGroup()
        // Measure what the browser laid out, and write the counts into the DOM for --dump-dom.
        // A legend entry must lie inside its chart, overlap no other entry and no tick label.
        let probe = """
        <script>
        window.addEventListener('load', () => {
          const charts = [...document.querySelectorAll('svg.chart')];
          const drawn = charts.filter(svg => { const box = svg.getBoundingClientRect(); return box.width > 100 && box.height > 100; });
          const marks = [...document.querySelectorAll('svg.chart polyline, svg.chart .point, svg.chart rect.bar')]
            .filter(mark => { const box = mark.getBBox(); return box.width > 0 || box.height > 0; });
          const meets = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
          let outside = 0, overlapping = 0, most = 0;
          for (const svg of charts) {
            const view = svg.viewBox.baseVal;
            const entries = [...svg.querySelectorAll('g.legend-entry')].map(entry => entry.getBBox());
            const ticks = [...svg.querySelectorAll('text.tick, text.axis, text.title')].map(text => text.getBBox());
            most = Math.max(most, entries.length);
            for (const [index, box] of entries.entries()) {
              if (box.x < 0 || box.y < 0 || box.x + box.width > view.width || box.y + box.height > view.height) outside++;
              if (entries.slice(index + 1).some(other => meets(box, other)) || ticks.some(tick => meets(box, tick))) overlapping++;
            }
          }
          document.body.setAttribute('data-charts', charts.length);
          document.body.setAttribute('data-drawn', drawn.length);
          document.body.setAttribute('data-marks', marks.length);
          document.body.setAttribute('data-legend-outside', outside);
          document.body.setAttribute('data-legend-overlapping', overlapping);
          document.body.setAttribute('data-most-series', most);
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
        var measures: [String: Int] = [:]
        for name in ["charts", "drawn", "marks", "legend-outside", "legend-overlapping", "most-series"] {
            guard let range = dom.range(of: "data-\(name)=\"") else { continue }
            measures[name] = Int(dom[range.upperBound...].prefix { $0.isNumber })
        }
        _ = try #require(measures["charts"], "the page did not run its probe; chromium said: \(dom.prefix(300))")
        return measures
    }

    @Test("every chart is drawn")
    func chartsAreDrawn() throws {
        let measures = try Self.browserMeasures(HTMLReport.render([(label: "fixture", results: ReportFixtures.results(scale: 1, references: true))]))
        // Which should I use: blocking latency, small and large streams, CPU, peer death (the
        // fixtures have no spinning row); per placement (two): a chart per transport (unix-socket,
        // notify), the ratio to the floor, latency by percentile, and a throughput chart per
        // transport that streams (unix-socket); then scale and invalidation.
        #expect(measures["charts"] == 5 + 2 * (2 + 1 + 1 + 1) + 1 + 1)
        #expect(measures["drawn"] == measures["charts"])
        #expect((measures["marks"] ?? 0) > 50)
        #expect(measures["legend-outside"] == 0)
        #expect(measures["legend-overlapping"] == 0)
    }

    @Test("a crowded run's charts keep at most 8 series, with legends inside and apart")
    func crowdedLegendsFit() throws {
        let measures = try Self.browserMeasures(HTMLReport.render([(label: "crowded", results: ReportFixtures.crowded())]))
        #expect((measures["charts"] ?? 0) >= 15)
        #expect(measures["drawn"] == measures["charts"])
        #expect((measures["most-series"] ?? 99) <= HTMLReport.maximumSeries)
        #expect((measures["most-series"] ?? 0) >= 6, "the crowded fixture fills the charts")
        #expect(measures["legend-outside"] == 0)
        #expect(measures["legend-overlapping"] == 0)
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

extension ReportFixtures {
    /// A run as crowded as a full one with references: every transport row of the fixtures again
    /// as HTTP framing, spinning, on the global executor and with the on-loop handler, and eight
    /// reference systems with long names, so that every chart's legend has more to hold than fits.
    static func crowded() -> RunResults {
        var results = results(scale: 1, references: true)
        let base = results.latency
        for row in base where row.transport == "unix-socket" || row.transport == "notify" {
            var http = row
            if row.transport == "unix-socket" { http.framing = .http; results.latency.append(http) }
            var global = row
            global.executor = LatencyResult.globalExecutor
            results.latency.append(global)
            var onLoop = row
            onLoop.handler = LatencyResult.onLoopHandler
            results.latency.append(onLoop)
            if row.placement == .splitCores {
                var spinning = row
                spinning.waitStrategy = "spin-then-block"
                results.latency.append(spinning)
            }
        }
        let names = ["zmq-reqrep", "zmq-pushpull", "dbus-daemon", "dbus-p2p", "grpc", "grpc-cpp", "iceoryx", "iceoryx-spin"]
        for (number, name) in names.enumerated() {
            for row in base where row.transport == "ref:nio" {
                var reference = row
                reference.transport = "ref:" + name
                reference.p50 = row.p50 + UInt64(number) * 1000
                if name.hasSuffix("-spin") {
                    guard row.placement == .splitCores else { continue }
                    reference.waitStrategy = "spin"
                }
                results.latency.append(reference)
            }
            for row in results.throughput ?? [] where row.transport == "ref:nio" {
                var reference = row
                reference.transport = "ref:" + name
                results.throughput?.append(reference)
            }
        }
        return results
    }
}
