import Foundation

/// Progress on standard error: a line per step, updated in place when standard error is a
/// terminal, so a long run is never silent and piped output stays readable.
public struct ProgressReporter: Sendable {
    public var enabled: Bool
    private let interactive: Bool

    public init(enabled: Bool = true) {
        self.enabled = enabled
        self.interactive = isatty(STDERR_FILENO) == 1
    }

    public func begin(step: Int, of total: Int, label: String) {
        guard enabled else { return }
        write(interactive ? "[\(step)/\(total)] \(label) ..." : "[\(step)/\(total)] \(label)\n")
    }

    public func update(label: String, fraction: Double) {
        guard enabled, interactive else { return }
        write("\r\u{1B}[2K  \(label) \(Int(fraction * 100))%")
    }

    public func end(label: String, summary: String) {
        guard enabled else { return }
        write(interactive ? "\r\u{1B}[2K  \(label): \(summary)\n" : "  \(summary)\n")
    }

    public func note(_ text: String) {
        guard enabled else { return }
        write(text + "\n")
    }

    private func write(_ text: String) {
        // What was printed before goes out first: piped, standard output is buffered, and a
        // progress line written past it landed in the middle of a table in a CI log.
        fflush(nil)
        FileHandle.standardError.write(Data(text.utf8))
    }
}
