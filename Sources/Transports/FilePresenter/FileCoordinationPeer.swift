import Glibc
import IPCCore
import IPCFraming

/// The far side of the file coordination tests: runs coordinated operations in its own process,
/// one command per line of standard input, so a test can hold a lock, write, or die mid-write
/// in a second process. `ipcbench peer --transport file-presenter --role coordinator` runs it.
///
/// It prints `READY <pid>` first, then one line per command: `OK` (with a result) or `ERR <why>`.
/// Files are named relative to the group directory.
///
/// | command | effect |
/// |---|---|
/// | `write <file> <text>` | a coordinated write that makes `text` the file's contents |
/// | `read <file>` | a coordinated read; answers `OK <contents>` |
/// | `hold-write <file>`, `hold-read <file>` | takes the file's exclusive or shared lock and keeps it |
/// | `release` | gives back the held lock |
/// | `write-halves <file> <count>` | `count` coordinated writes of 4 KiB, each one letter, written in two halves 1 ms apart |
/// | `tear <endpoint>` | connects to the endpoint, then, holding its inbox's lock, writes part of a record and stops, to be killed |
public struct FileCoordinationPeer {
    public let group: GroupDirectory
    private var held: CoordinatedFile?
    /// Kept open until the process ends, as a client that dies mid-write would keep it.
    private var connection: FilePresenterConnection?

    public init(group: GroupDirectory) {
        self.group = group
    }

    /// Runs commands until standard input closes.
    public mutating func run() {
        answer("READY \(getpid())")
        while let line = readLine() {
            let words = line.split(separator: " ", maxSplits: 2).map(String.init)
            do {
                answer("OK" + (try perform(words).map { " " + $0 } ?? ""))
            } catch {
                answer("ERR \(error)")
            }
        }
    }

    private mutating func perform(_ words: [String]) throws -> String? {
        let coordinator = FileCoordinator()
        switch (words.first ?? "", words.count) {
        case ("write", 3):
            try coordinator.coordinate(writingItemAt: try path(words[1]), timeout: .seconds(10)) { try $0.replaceContents(with: Array(words[2].utf8)) }
        case ("read", 2):
            return try coordinator.coordinate(readingItemAt: try path(words[1]), timeout: .seconds(10)) { String(decoding: try $0.read(), as: UTF8.self) }
        case ("hold-write", 2), ("hold-read", 2):
            let file = try CoordinatedFile(path: try path(words[1]))
            try file.lock(exclusive: words[0] == "hold-write", timeout: .seconds(10))
            held = file
        case ("release", 1):
            held?.unlock()
            held = nil
        case ("write-halves", 3):
            let file = try CoordinatedFile(path: try path(words[1]))
            for index in 0..<(Int(words[2]) ?? 0) {
                let half = [UInt8](repeating: UInt8(ascii: "a") + UInt8(index % 26), count: 2048)
                try coordinator.coordinate(writingItem: file, timeout: .seconds(10)) { access in
                    try access.write(half, at: 0)
                    var pause = timespec(tv_sec: 0, tv_nsec: 1_000_000)
                    nanosleep(&pause, nil)
                    try access.write(half, at: half.count)
                }
            }
        case ("tear", 2):
            let endpoint = try Endpoint(group: group, name: words[1])
            connection = try FilePresenterTransport().connect(to: endpoint, options: .defaults)
            let inbox = try CoordinatedFile(path: JournalNames.inbox(endpoint), create: false)
            try inbox.lock(exclusive: true, timeout: .seconds(10))
            held = inbox
            let header = try Journal.readHeader(FileAccess(file: inbox, isWriting: true))
            // A record that announces 1000 payload bytes, cut off after 10 of them.
            var partial = RecordHeader(kind: .frame, sender: SenderID(pid: getpid(), serial: 0)).bytes
            try BinaryFrameEncoder(maximumPayloadLength: 1000).encodeHeader(FrameHeader(kind: .message, msgid: 9, correlation: 0, payloadLength: 1000), into: &partial)
            partial += [UInt8](repeating: 0xEE, count: 10)
            try FileAccess(file: inbox, isWriting: true).write(partial, at: header.committedEnd)
        default:
            throw IPCError(code: .unsupportedOperation, message: "unknown command \(words.joined(separator: " ").debugDescription)")
        }
        return nil
    }

    private func path(_ name: String) throws -> String {
        try Endpoint(group: group, name: name).description
    }

    private func answer(_ line: String) {
        let bytes = Array((line + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(STDOUT_FILENO, $0.baseAddress, $0.count) }
    }
}
