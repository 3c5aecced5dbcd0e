import Foundation

extension ConformanceReportWriter {
    /// JUnit XML as CI reporters read it (Jenkins, GitLab, GitHub test-report actions): one
    /// `<testsuite>` per subject, one `<testcase>` per case. Failures and unexpected passes are
    /// `<failure>`; not-applicable cases and expected failures are `<skipped>`; every detail is
    /// in `<system-out>`, and non-strict results say so there.
    public static func junitXML(_ reports: [ConformanceReport]) -> String {
        let timestamp = ISO8601DateFormatter()
        func count(_ report: ConformanceReport, _ grades: Set<ConformanceResult.Grade>) -> Int {
            report.results.filter { grades.contains($0.grade) }.count
        }
        let skippedGrades: Set<ConformanceResult.Grade> = [.notApplicable, .expectedFailure]
        let failureGrades: Set<ConformanceResult.Grade> = [.failed, .unexpectedPass]
        var xml = #"<?xml version="1.0" encoding="UTF-8"?>"# + "\n"
        let total = reports.reduce(0) { $0 + $1.results.count }
        let failures = reports.reduce(0) { $0 + count($1, failureGrades) }
        let skipped = reports.reduce(0) { $0 + count($1, skippedGrades) }
        let seconds = reports.reduce(0) { $0 + $1.seconds }
        xml += #"<testsuites name="ipcbench conformance" tests="\#(total)" failures="\#(failures)" errors="0" skipped="\#(skipped)" time="\#(seconds)">"# + "\n"
        for report in reports {
            xml += #"  <testsuite name="\#(escaped(report.subject))" tests="\#(report.results.count)" failures="\#(count(report, failureGrades))" errors="0" skipped="\#(count(report, skippedGrades))" time="\#(report.seconds)" timestamp="\#(timestamp.string(from: report.startedAt))">"# + "\n"
            for result in report.results {
                let testCase = ConformanceSuite.catalog.first { $0.id == result.id }
                let area = testCase.map { "\($0.area.rawValue) \($0.area)" } ?? "other"
                let classname = escaped("conformance.\(report.subject).\(area)")
                xml += #"    <testcase classname="\#(classname)" name="\#(escaped(result.id + " " + result.statement))" time="\#(result.seconds)">"# + "\n"
                switch result.grade {
                case .failed, .unexpectedPass:
                    xml += #"      <failure message="\#(escaped(result.grade.rawValue + ": " + result.detail))" type="\#(result.grade.rawValue)"/>"# + "\n"
                case .notApplicable, .expectedFailure:
                    xml += #"      <skipped message="\#(escaped(result.grade.rawValue + ": " + result.detail))"/>"# + "\n"
                case .passed, .nonStrict, .informational:
                    break
                }
                xml += "      <system-out>\(escaped(result.grade.rawValue + ": " + result.detail))</system-out>\n"
                xml += "    </testcase>\n"
            }
            xml += "  </testsuite>\n"
        }
        xml += "</testsuites>\n"
        return xml
    }
}
