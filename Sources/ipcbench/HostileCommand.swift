import ArgumentParser
import CIPCShims
import Foundation
import IPCConformance
import IPCCore
import IPCSystem
import SystemPackage

/// A hostile peer for the tests: a second process that sends what no well-behaved peer would,
/// below the transports (raw socket bytes, raw queue messages, raw writes into shared files).
struct HostileCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hostile",
        abstract: "Act as a hostile peer (started by the tests).",
        shouldDisplay: false,
        subcommands: [HostileSocketCommand.self, HostileQueueCommand.self, HostileWriteCommand.self]
    )
}

/// Prints the announcement `PeerProcess` waits for.
private func announceReady() {
    FileHandle.standardOutput.write(Data((ConformancePeer.Announcement(pid: getpid()).line + "\n").utf8))
}

/// Reads a file of bytes, or a hex string (`--hex`).
private func bytes(fromHex hex: String) throws -> [UInt8] {
    let digits = Array(hex.utf8.filter { $0 != UInt8(ascii: " ") })
    guard digits.count % 2 == 0 else { throw ValidationError("odd number of hex digits in \(hex)") }
    return try stride(from: 0, to: digits.count, by: 2).map { index in
        guard let byte = UInt8(String(decoding: digits[index...index + 1], as: UTF8.self), radix: 16) else {
            throw ValidationError("not hex: \(hex)")
        }
        return byte
    }
}

/// Connects to an `AF_UNIX` stream endpoint, writes the bytes of a file (optionally repeated,
/// in chunks with pauses), then ends as told and waits for the listener to close the connection.
///
/// Prints `READY <pid>` once connected. Exit status: 0 if the listener closed the connection (or
/// refused further bytes) before `--timeout`, 3 if it did not, 1 on other failures.
struct HostileSocketCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "socket", shouldDisplay: false)

    enum Ending: String, ExpressibleByArgument {
        /// Keep the connection open and write nothing more.
        case stall
        /// Stop writing (`shutdown(SHUT_WR)`): the listener sees end of file.
        case shutdown
    }

    @Option(help: "The socket path.")
    var path: String

    @Option(help: "A file whose bytes are written.")
    var input: String

    @Option(help: "Write the file's bytes this many times.")
    var repeatCount: Int = 1

    @Option(help: "Bytes per write (0: everything at once).")
    var chunk: Int = 0

    @Option(help: "Pause between writes, in microseconds.")
    var pauseMicroseconds: Int = 0

    @Option(help: "stall or shutdown.")
    var then: Ending = .stall

    @Option(help: "Seconds to wait for the listener to take the connection (while its backlog is full), and then for it to close the connection.")
    var timeout: Double = 30

    func run() throws {
        // A listener under test that accepts nobody fails the peer (its backlog full), not hangs it.
        let fd = try UnixSocket.connect(path: path, timeout: .seconds(timeout.isFinite ? min(max(timeout, 0), 86_400) : 86_400)) { true }
        announceReady()
        let data = try [UInt8](Data(contentsOf: URL(fileURLWithPath: input)))
        let step = chunk > 0 ? chunk : max(data.count, 1)
        do {
            for _ in 0..<repeatCount {
                var offset = 0
                while offset < data.count {
                    let end = min(offset + step, data.count)
                    var written = 0
                    try data[offset..<end].withUnsafeBytes { part in
                        try UnixSocket.sendAll(fd, header: part, payload: UnsafeRawBufferPointer(start: nil, count: 0), deadline: .now + .seconds(timeout), written: &written)
                    }
                    offset = end
                    if pauseMicroseconds > 0 { usleep(UInt32(pauseMicroseconds)) }
                }
            }
        } catch let error as IPCError where error.code == .peerInvalidated {
            // The listener dropped the connection while bytes were still coming: dropped.
            throw ExitCode(0)
        }
        if then == .shutdown { _ = Glibc.shutdown(fd.rawValue, CInt(SHUT_WR)) }
        throw ExitCode(Self.waitForClose(fd, seconds: timeout) ? 0 : 3)
    }

    /// Reads (and discards) until end of file or `seconds` pass.
    static func waitForClose(_ fd: FileDescriptor, seconds: Double) -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while ContinuousClock.now < deadline {
            var descriptor = pollfd(fd: fd.rawValue, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) > 0 else { continue }
            let count = buffer.withUnsafeMutableBytes { (try? UnixSocket.read(fd, into: $0)) ?? 0 }
            if count == 0 { return true }
        }
        return false
    }
}

/// Sends raw messages into a POSIX message queue, as any process of the queue's owner can.
struct HostileQueueCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "queue", shouldDisplay: false)

    @Option(help: "The queue's name (starts with /).")
    var name: String

    @Option(help: "One queue message, in hex. Repeat for several; they are sent in order.")
    var hex: [String] = []

    @Flag(help: "Create the queue (mode 0600, as whoever runs this), as a squatter would, instead of opening it.")
    var create = false

    func run() throws {
        if create {
            try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64).close()
            return
        }
        let queue = try MessageQueue.open(name: name, forWriting: true)
        defer { queue.close() }
        for message in hex {
            let bytes = try bytes(fromHex: message)
            try bytes.withUnsafeBytes { try queue.send($0, deadline: .after(.seconds(5))) }
        }
    }
}

/// Writes bytes into a file that another process uses (with `pwrite`, as a stray or hostile
/// process of the same user could), then optionally wakes a futex word in it.
struct HostileWriteCommand: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "write", shouldDisplay: false)

    @Option(help: "The file.")
    var file: String

    @Option(help: "offset:hex — write these bytes at this offset. Repeat for several writes, done in order.")
    var at: [String]

    @Option(help: "Then increment the 32-bit futex word at this offset and wake its waiters.")
    var post: [Int] = []

    func run() throws {
        // Links are followed: a tester names a file a process maps through /proc/<pid>/map_files.
        let fd = open(file, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw ValidationError("cannot open \(file): errno \(errno)") }
        defer { try? FileDescriptor(rawValue: fd).close() }
        for write in at {
            let parts = write.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, let offset = Int(parts[0]) else { throw ValidationError("--at takes offset:hex, got \(write)") }
            let bytes = try bytes(fromHex: String(parts[1]))
            let count = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
            guard count == bytes.count else { throw ValidationError("pwrite at \(offset) wrote \(count) of \(bytes.count) bytes") }
        }
        guard let highest = post.max() else { return }
        let mapping = try SharedMapping(path: file, length: highest + 4, create: false)
        for offset in post {
            FutexCounter(in: mapping, at: offset).post()
        }
    }
}
