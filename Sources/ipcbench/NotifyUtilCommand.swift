import ArgumentParser
import Foundation
import IPCCore
import NotifyTransport

/// Posts, observes and reads named notifications from the command line, like Darwin's
/// `notifyutil`. Tests use it as the second process.
struct NotifyUtilCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notifyutil",
        abstract: "Post, wait for, and read the state of named notifications in a group directory.",
        discussion: """
        Actions run in this order: --set, --post, --get, --wait.
        Examples:
          ipcbench notifyutil --group /tmp/g --post com.example.changed --count 3
          ipcbench notifyutil --group /tmp/g --set com.example.level=18446744073709551615
          ipcbench notifyutil --group /tmp/g --get com.example.level
          ipcbench notifyutil --group /tmp/g --wait com.example.changed --timeout 10
        """
    )

    @Option(help: "Group directory (absolute path).")
    var group: String

    @Option(help: "Post this name (repeatable).")
    var post: [String] = []

    @Option(help: "How many times to post each --post name.")
    var count: Int = 1

    @Option(help: "Set a name's 64-bit state: NAME=VALUE (repeatable).")
    var set: [String] = []

    @Option(help: "Print a name's 64-bit state (repeatable).")
    var get: [String] = []

    @Option(help: "Register for a name, print READY, and exit 0 at its first post (1 on timeout).")
    var wait: String?

    @Option(help: "Seconds --wait waits.")
    var timeout: Double = 10

    func validate() throws {
        guard count >= 1 else { throw ValidationError("--count must be at least 1") }
        for assignment in set where parse(assignment) == nil {
            throw ValidationError("--set takes NAME=VALUE with VALUE from 0 to \(UInt64.max); got '\(assignment)'")
        }
    }

    private func parse(_ assignment: String) -> (String, UInt64)? {
        guard let equals = assignment.lastIndex(of: "="), let value = UInt64(assignment[assignment.index(after: equals)...]) else { return nil }
        return (String(assignment[..<equals]), value)
    }

    func run() throws {
        let center = try NotifyCenter(group: GroupDirectory(path: group))
        for assignment in set {
            let (name, value) = parse(assignment)!
            try center.setState(value, for: name)
        }
        for name in post {
            for _ in 0..<count { try center.post(name) }
        }
        for name in get {
            print(try center.state(for: name))
        }
        if let wait {
            let notified = DispatchSemaphore(value: 0)
            let registration = try center.register(wait) { notified.signal() }
            FileHandle.standardOutput.write(Data("READY\n".utf8))
            let result = notified.wait(timeout: .now() + timeout)
            registration.cancel()
            guard result == .success else { throw ExitCode(1) }
            print("notified")
        }
    }
}
