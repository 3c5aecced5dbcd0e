import Foundation
import IPCConformance
import Testing

/// Runs one test in a process of its own: the test bundle again, filtered to that test.
///
/// For tests that open thousands of descriptors. Foundation's `Process.run()` crashed (a bad
/// pointer in its spawn path) when another test in the same process spawned a peer while
/// thousands of descriptors were being opened; in a process of its own such a test disturbs
/// nobody. The child sees ``isChildRun`` and runs the test's body; the parent checks its exit
/// status and shows its output on failure.
public enum ChildProcessTest {
    private static let variable = "IPCBENCH_TEST_CHILD"

    /// The threads this process runs now.
    public static func threadCount() -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task").count) ?? 0
    }

    /// Whether this process is the child started by ``run(filter:)``.
    public static var isChildRun: Bool { ProcessInfo.processInfo.environment[variable] != nil }

    /// Runs the tests matching `filter` (a regular expression over test names) in a child
    /// process, and records an issue if it fails.
    public static func run(filter: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
        process.arguments = ["--testing-library", "swift-testing", "--filter", filter]
        var environment = ProcessInfo.processInfo.environment
        environment[variable] = "1"
        process.environment = environment
        // Its standard error joins its standard output (a copy of the same pipe).
        let output = try ChildProcess.run(process, output: true, errorToOutput: true).output!
        let data = output.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        #expect(process.terminationStatus == 0, "the child run of \(filter) failed:\n\(text)", sourceLocation: sourceLocation)
        #expect(text.contains("passed"), "the child run of \(filter) ran no test:\n\(text)", sourceLocation: sourceLocation)
        for line in text.split(separator: "\n") where line.hasPrefix("engine") || line.hasPrefix("scale") {
            print(line)
        }
    }
}
