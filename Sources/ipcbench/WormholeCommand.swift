import ArgumentParser
import Foundation
import IPCCore
import NotifyTransport
import Wormhole

/// MMWormhole's mailbox from the command line (over the group's notify center): pass, read,
/// clear and listen for messages. Tests use it as the second process.
struct WormholeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "wormhole",
        abstract: "Pass, read, clear and listen for wormhole messages in a group directory.",
        discussion: """
        Actions run in this order: --clear-all, --clear, --pass, --pass-pattern, --read, --listen.
        Examples:
          ipcbench wormhole --group /tmp/g --pass com.example.status=ready
          ipcbench wormhole --group /tmp/g --read com.example.status
          ipcbench wormhole --group /tmp/g --listen com.example.status --count 2 --timeout 10
        """
    )

    @Option(help: "Group directory (absolute path).")
    var group: String

    @Option(help: "Pass a message: IDENTIFIER=TEXT (the text's UTF-8 bytes; repeatable).")
    var pass: [String] = []

    @Option(help: "Pass --count messages of --size bytes under this identifier, back to back; message k is k mod 251 in every byte.")
    var passPattern: String?

    @Option(help: "Bytes per --pass-pattern message.")
    var size: Int = 4096

    @Option(help: "Messages --pass-pattern passes, or --listen waits for.")
    var count: Int = 1

    @Option(help: "Print the message stored under an identifier as text, or '(none)' (repeatable).")
    var read: [String] = []

    @Option(help: "Remove the message of an identifier (repeatable).")
    var clear: [String] = []

    @Flag(help: "Remove every message of the group.")
    var clearAll = false

    @Option(help: "Listen for an identifier, print READY, then each message as text, and exit 0 after --count messages (1 on timeout).")
    var listen: String?

    @Option(help: "Seconds --listen waits.")
    var timeout: Double = 10

    func validate() throws {
        guard count >= 1 else { throw ValidationError("--count must be at least 1") }
        guard (0...(16 << 20)).contains(size) else { throw ValidationError("--size takes 0 to \(16 << 20)") }
        for assignment in pass where !assignment.contains("=") {
            throw ValidationError("--pass takes IDENTIFIER=TEXT; got '\(assignment)'")
        }
    }

    func run() throws {
        let directory = GroupDirectory(path: group)
        let wormhole = try Wormhole(group: directory, center: try NotifyCenter(group: directory))
        if clearAll { try wormhole.clearAllMessageContents() }
        for identifier in clear { try wormhole.clearMessageContents(forIdentifier: identifier) }
        for assignment in pass {
            let equals = assignment.firstIndex(of: "=")!
            try wormhole.passMessage(Array(assignment[assignment.index(after: equals)...].utf8), identifier: String(assignment[..<equals]))
        }
        if let passPattern {
            for index in 0..<count {
                try wormhole.passMessage([UInt8](repeating: UInt8(index % 251), count: size), identifier: passPattern)
            }
        }
        for identifier in read {
            print(try wormhole.message(withIdentifier: identifier).map { String(decoding: $0, as: UTF8.self) } ?? "(none)")
        }
        if let listen {
            let messages = try wormhole.listen(forIdentifier: listen)
            let done = DispatchSemaphore(value: 0)
            let count = count
            Task.detached {
                var seen = 0
                for await message in messages {
                    FileHandle.standardOutput.write(Data(message + [0x0A]))
                    seen += 1
                    if seen == count { break }
                }
                done.signal()
            }
            FileHandle.standardOutput.write(Data("READY\n".utf8))
            let result = done.wait(timeout: .now() + timeout)
            wormhole.stopListening(forIdentifier: listen)
            guard result == .success else { throw ExitCode(1) }
        }
    }
}
