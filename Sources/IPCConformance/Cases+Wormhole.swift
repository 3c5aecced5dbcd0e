public import Foundation
public import IPCCore
import Synchronization

/// Area 10: MMWormhole's mailbox, for a subject with a ``WormholeMailbox``
/// (``ConformanceSubject/wormhole``). The other process is the subject's wormhole program.
enum WormholeCases {
    static let all: [ConformanceCase] = [outlivesSender, neverTorn, listeners, clearing]

    static let outlivesSender = ConformanceCase(
        "10.1", "A message passed by another process that has since exited reads the same here (0 B, text, 1 MiB), and one passed here reads the same in a process started afterwards",
        requires: .wormhole
    ) { context in
        let mailbox = try context.wormhole()
        try await context.wormholeProgram(["--pass", "conformance.text=hello", "--pass", "conformance.empty="])
        let text = try mailbox.message(withIdentifier: "conformance.text")
        try check(text == Array("hello".utf8), "a text passed by an exited process reads as \(text.map { String(decoding: $0, as: UTF8.self).debugDescription } ?? "nil")")
        let empty = try mailbox.message(withIdentifier: "conformance.empty")
        try check(empty == [], "an empty message passed by an exited process reads as \(empty.map { "\($0.count) bytes" } ?? "nil")")
        try await context.wormholeProgram(["--pass-pattern", "conformance.big", "--count", "3", "--size", String(1 << 20)])
        let big = try mailbox.message(withIdentifier: "conformance.big")
        try check(big == [UInt8](repeating: 2, count: 1 << 20), "the last of three 1 MiB messages reads as \(big.map { "\($0.count) bytes, first \($0.first.map(String.init) ?? "-")" } ?? "nil")")
        try check(try mailbox.message(withIdentifier: "conformance.never") == nil, "an identifier nothing was passed under reads as a message")
        try mailbox.passMessage(Array("from here".utf8), identifier: "conformance.back")
        let read = try await context.wormholeProgram(["--read", "conformance.back"])
        try check(read == "from here\n", "a process started after the pass read \(read.debugDescription)")
        return .passed("0 B, text and 1 MiB read whole after their sender exited; this process's message read by a later one")
    }

    static let neverTorn = ConformanceCase(
        "10.2", "Reads never see a torn message: while another process passes 256 KiB messages back to back, and after it is killed with SIGKILL part-way, every read here is one whole message",
        requires: .wormhole
    ) { context in
        let mailbox = try context.wormhole()
        let size = 256 << 10
        let writer = try context.startWormholeProgram(["--pass-pattern", "conformance.torn", "--count", "1000000", "--size", String(size)])
        var whole = 0
        let until = ContinuousClock.now + .seconds(1)
        while ContinuousClock.now < until {
            guard let message = try mailbox.message(withIdentifier: "conformance.torn") else { continue }
            try check(message.count == size && Set(message).count == 1, "a read during the writes gave \(message.count) bytes of \(Set(message).count) different values: torn")
            whole += 1
        }
        writer.kill()
        let last = try mailbox.message(withIdentifier: "conformance.torn")
        try check(last.map { $0.count == size && Set($0).count == 1 } == true, "after the writer was killed the message reads as \(last.map { "\($0.count) bytes of \(Set($0).count) values" } ?? "nil")")
        try check(whole > 0, "no message was read in a second of writes")
        return .passed("\(whole) reads during the writes, each whole; whole after the kill")
    }

    static let listeners = ConformanceCase(
        "10.3", "A listener here is given what another process passes; after stopListening its stream ends",
        requires: .wormhole
    ) { context in
        let mailbox = try context.wormhole()
        let stream = try mailbox.listen("conformance.listen")
        let received = Mutex<[String]>([])
        let ended = Mutex(false)
        let reader = Task {
            for await message in stream { received.withLock { $0.append(String(decoding: message, as: UTF8.self)) } }
            ended.withLock { $0 = true }
        }
        defer { reader.cancel() }
        try await context.wormholeProgram(["--pass", "conformance.listen=one"])
        guard await poll(within: .seconds(10), { received.withLock { $0 }.contains("one") }) else {
            throw ConformanceFailure("a message another process passed did not reach the listener within 10 s (got \(received.withLock { $0 }))")
        }
        mailbox.stopListening("conformance.listen")
        guard await poll(within: .seconds(5), { ended.withLock { $0 } }) else {
            throw ConformanceFailure("the listener's stream did not end within 5 s of stopListening")
        }
        return .passed("given the message; the stream ended at stopListening")
    }

    static let clearing = ConformanceCase(
        "10.4", "clearMessageContents removes one identifier's message and clearAllMessageContents every one, as the other process sees, both ways",
        requires: .wormhole
    ) { context in
        let mailbox = try context.wormhole()
        try mailbox.passMessage(Array("1".utf8), identifier: "conformance.a")
        try mailbox.passMessage(Array("2".utf8), identifier: "conformance.b")
        try await context.wormholeProgram(["--clear", "conformance.a"])
        try check(try mailbox.message(withIdentifier: "conformance.a") == nil, "a message another process cleared still reads")
        try check(try mailbox.message(withIdentifier: "conformance.b") == Array("2".utf8), "clearing one identifier removed another")
        try mailbox.clearAllMessageContents()
        let read = try await context.wormholeProgram(["--read", "conformance.b"])
        try check(read == "(none)\n", "after clearing everything here another process reads \(read.debugDescription)")
        try mailbox.passMessage(Array("3".utf8), identifier: "conformance.c")
        try mailbox.clearMessageContents(forIdentifier: "conformance.c")
        let cleared = try await context.wormholeProgram(["--read", "conformance.c"])
        try check(cleared == "(none)\n", "after clearing an identifier here another process reads \(cleared.debugDescription)")
        return .passed("cleared one and all, seen from both sides")
    }
}

/// How the wormhole cases (area 10) reach a ``WormholeMailbox``: the mailbox of a group in this
/// process, and a program that passes, reads and clears from another process.
///
/// The program keeps the contract of `ipcbench wormhole`: the suite runs it with
/// ``programArguments``, then `--group DIR`, then `--pass ID=TEXT` (repeatable),
/// `--pass-pattern ID --count K --size N` (K messages of N bytes, message k being k mod 251 in
/// every byte), `--read ID` (prints the message as text and a newline, or `(none)`), `--clear ID`
/// or `--clear-all`; exit status 0 on success.
public struct WormholeAccess: Sendable {
    public var program: URL
    public var programArguments: [String]
    let open: @Sendable (GroupDirectory) throws -> ErasedWormhole

    /// - Parameter open: opens the mailbox of a group directory in this process.
    public init<Mailbox: WormholeMailbox>(program: URL, programArguments: [String] = [], open: @escaping @Sendable (GroupDirectory) throws -> Mailbox) {
        self.program = program
        self.programArguments = programArguments
        self.open = { group in ErasedWormhole(try open(group)) }
    }
}

/// A ``WormholeMailbox`` of any type, for the cases.
struct ErasedWormhole: Sendable {
    private let store: @Sendable ([UInt8], String) throws -> Void
    private let load: @Sendable (String) throws -> [UInt8]?
    private let clearOne: @Sendable (String) throws -> Void
    private let clearAll: @Sendable () throws -> Void
    let listen: @Sendable (String) throws -> AsyncStream<[UInt8]>
    let stopListening: @Sendable (String) -> Void

    init<Mailbox: WormholeMailbox>(_ mailbox: Mailbox) {
        store = { try mailbox.passMessage($0, identifier: $1) }
        load = { try mailbox.message(withIdentifier: $0) }
        clearOne = { try mailbox.clearMessageContents(forIdentifier: $0) }
        clearAll = { try mailbox.clearAllMessageContents() }
        listen = { try mailbox.listen(forIdentifier: $0) }
        stopListening = { mailbox.stopListening(forIdentifier: $0) }
    }

    func passMessage(_ payload: [UInt8], identifier: String) throws { try store(payload, identifier) }
    func message(withIdentifier identifier: String) throws -> [UInt8]? { try load(identifier) }
    func clearMessageContents(forIdentifier identifier: String) throws { try clearOne(identifier) }
    func clearAllMessageContents() throws { try clearAll() }
}

extension CaseContext {
    /// The subject's mailbox for this case's group.
    func wormhole() throws -> ErasedWormhole {
        try subject.wormhole!.open(group)
    }

    /// Runs the subject's wormhole program for this case's group with `arguments` and returns
    /// what it printed.
    /// - Throws: ``ConformanceFailure`` if it exits with a status other than 0.
    @discardableResult
    func wormholeProgram(_ arguments: [String]) async throws -> String {
        let access = subject.wormhole!
        return try await runProgram(access.program, access.programArguments + ["--group", group.path] + arguments)
    }

    /// Starts the subject's wormhole program for this case's group, without waiting for it; it
    /// is killed when the case ends.
    func startWormholeProgram(_ arguments: [String]) throws -> Process {
        let access = subject.wormhole!
        let process = Process()
        process.executableURL = access.program
        process.arguments = access.programArguments + ["--group", group.path] + arguments
        process.standardOutput = FileHandle.nullDevice
        // Through the gate, so that it cannot inherit a pipe another start is making.
        _ = try ChildProcess.run(process)
        onTearDown {
            if process.isRunning { process.kill() }
        }
        return process
    }
}

extension Process {
    /// Sends SIGKILL and waits until the process is gone.
    func kill() {
        Foundation.kill(processIdentifier, SIGKILL)
        waitUntilExit()
    }
}
