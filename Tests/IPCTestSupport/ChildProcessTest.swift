import Foundation
import IPCConformance
public import Testing

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
    public static func run(filter: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
        process.arguments = ["--testing-library", "swift-testing", "--filter", filter]
        var environment = ProcessInfo.processInfo.environment
        environment[variable] = "1"
        process.environment = environment
        // Its standard error joins its standard output (a copy of the same pipe).
        let output = try ChildProcess.run(process, output: true, errorToOutput: true).output!
        // Waited for on a thread of its own: the child runs as long as its test (a minute on a
        // loaded machine), and Swift's cooperative pool has two threads on a two-core machine.
        // Two child runs each holding one stalled every other test of this process (CI: nothing
        // finished for 55 s, and a burst peer's sends to a test that could not read timed out).
        let (status, data) = await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                let data = output.readDataToEndOfFile()
                process.waitUntilExit()
                continuation.resume(returning: (process.terminationStatus, data))
            }
        }
        let text = String(decoding: data, as: UTF8.self)
        #expect(status == 0, "the child run of \(filter) failed:\n\(text)", sourceLocation: sourceLocation)
        #expect(text.contains("passed"), "the child run of \(filter) ran no test:\n\(text)", sourceLocation: sourceLocation)
        for line in text.split(separator: "\n") where line.hasPrefix("engine") || line.hasPrefix("scale") {
            print(line)
        }
    }
}
