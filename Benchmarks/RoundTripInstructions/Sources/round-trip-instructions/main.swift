// Instructions per round trip through the connection engine, counted by callgrind in both
// processes (Scripts/benchmarks.sh, "instructions per round trip"). A synchronous `main`: valgrind
// 3.19 crashes on a Swift program whose `main` is `async` (its main thread parks in libdispatch's
// signal thread), so the async work runs in a task and `main` waits for it.
//
//   round-trip-instructions serve  <group directory> <on-loop|task|sink|floor|floor-task|floor-sink>
//   round-trip-instructions client <group directory> <round trips> <payload bytes> [engine|stream|floor|floor-cancellable|floor-stream]
//
// The server listens at `<group>/echo` over unix-socket (binary framing), echoes every request
// (`sink`: see below), and exits once its one client has gone. The client connects (retrying until the server is
// there), then makes its round trips from a task on the connection's executor, one at a time.
// `floor`, `floor-task` (a server) and `floor`, `floor-cancellable` (a client) are the Swift floor instead of
// the engine (SwiftFloor.swift): the same frames, with nothing but what any Swift program
// needs for them. With `ROUND_TRIP_TIMES` set, a client prints its round trips' median and 99th
// percentile (the counted runs leave it unset: no clock is read).
//
// `stream` (a client) and `sink` (a server) are the one-way stream instead: the client sends its
// count of messages, one `send` each, from a task on the connection's executor, as the harness's
// throughput rows do; then one request, which the server answers with the number of messages it
// took (8 bytes, big-endian), so the client checks that none was lost. The server takes each
// message in place on its loop, with a borrowing handler, as the harness's sink peer does.
// With `ROUND_TRIP_TIMES` set, it prints the time from its first send to the reply.
// `floor-stream` (a client) and `floor-sink` (a server) are the same stream's Swift floor
// (SwiftFloorStream.swift); each faces the engine's other side as well as its own.
//
// With `ROUND_TRIP_TRANSPORT` set to `notify` or `message-port`, the engine's sides use that
// transport instead of unix-socket (the Swift floor's sides and the stream are unix-socket
// only). A server makes `<group>/echo.ready` once it listens, whatever the transport.
//
// With `ROUND_TRIP_SPIN` set, every side spins: the engine's connections with the
// spin-then-block wait strategy (50 µs, the harness's), the Swift floor's sides with reads that
// do not wait (SwiftFloor.swift). Only with the processes on different cores.
import Dispatch
import Foundation
import IPCCore
import MessagePortTransport
import NotifyTransport
import UnixSocketTransport

/// Runs `body` as a task and waits for it on this (non-async) thread; exits 1 with its error.
func runAndWait(_ body: @escaping @Sendable () async throws -> Void) {
    let done = DispatchSemaphore(value: 0)
    let failure = LockedError()
    Task {
        do { try await body() } catch { failure.set(error) }
        done.signal()
    }
    done.wait()
    if let error = failure.get() {
        FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
        exit(1)
    }
}

final class LockedError: @unchecked Sendable {
    private let lock = NSLock()
    private var error: (any Error)?
    func set(_ error: any Error) { lock.withLock { self.error = error } }
    func get() -> (any Error)? { lock.withLock { error } }
}

func usage() -> Never {
    FileHandle.standardError.write(Data("usage: round-trip-instructions serve <group directory> <on-loop|task|sink|floor|floor-task|floor-sink> | client <group directory> <round trips> <payload bytes> [engine|stream|floor|floor-cancellable|floor-stream]\n".utf8))
    exit(64)
}

let arguments = CommandLine.arguments
guard arguments.count >= 4 else { usage() }
let endpoint: Endpoint
do {
    // Scoped to the group (`<group identifier>.echo`), as message-port requires; the socket
    // file is still `<group>/echo.sock` for the Swift floor.
    let group = try GroupDirectory(path: arguments[2])
    endpoint = try Endpoint(group: group, name: ProcessInfo.processInfo.environment["ROUND_TRIP_TRANSPORT"] == "message-port" ? group.identifier + ".echo" : "echo")
} catch {
    FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
    exit(64)
}
/// unix-socket with binary framing, unless `ROUND_TRIP_TRANSPORT` names another transport.
let transportName = ProcessInfo.processInfo.environment["ROUND_TRIP_TRANSPORT"] ?? "unix-socket"
let transport: any MessageTransport
switch transportName {
case "unix-socket": transport = UnixSocketTransport(framing: .binary)
case "notify": transport = NotifyTransport()
case "message-port": transport = MessagePortTransport()
default:
    FileHandle.standardError.write(Data("round-trip-instructions: ROUND_TRIP_TRANSPORT is unix-socket, notify or message-port, not \(transportName)\n".utf8))
    exit(64)
}
guard transportName == "unix-socket" || !(arguments[3].hasPrefix("floor") || arguments.last!.hasPrefix("floor") || arguments.last! == "stream" || arguments[3] == "sink") else {
    FileHandle.standardError.write(Data("round-trip-instructions: the Swift floor and the stream are unix-socket only\n".utf8))
    exit(64)
}
/// The stream's one-way messages' msgid.
let streamMessage: UInt32 = 2
/// The engine's wait strategy: spin-then-block with `ROUND_TRIP_SPIN` set, else blocking.
let engineWaitStrategy: WaitStrategy = floorSpins ? .spinThenBlock() : .blocking

/// Connects to the server, retrying for up to 120 s while its socket is not there yet.
@Sendable func connectRetrying(_ transport: any MessageTransport, to endpoint: Endpoint) async throws -> any MessageConnection {
    let deadline = ContinuousClock.now + .seconds(120)
    while true {
        do {
            return try await transport.connect(to: endpoint, options: .defaults { $0.waitStrategy = engineWaitStrategy })
        } catch let error as IPCError where error.code == .endpointNotFound && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}

/// Listens at the endpoint and serves its one client until it goes.
@Sendable func serveOneClient<T: MessageTransport>(_ transport: T, options: ConnectionOptions) async throws {
    let listener = try transport.listen(at: endpoint, options: options, acceptFilter: nil)
    defer { listener.close() }
    // Listening: the scripts wait for this file (Scripts/wait-for-server.sh).
    FileManager.default.createFile(atPath: arguments[2] + "/echo.ready", contents: nil)
    for await connection in listener.connections {
        for await _ in connection.messages {}
        return
    }
}

switch arguments[1] {
case "serve" where arguments[3] == "floor-sink":
    do {
        try runFloorSink(path: arguments[2] + "/echo.sock")
    } catch {
        FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
        exit(1)
    }
case "serve" where arguments[3] == "floor" || arguments[3] == "floor-task":
    do {
        try runFloorServer(path: arguments[2] + "/echo.sock", handingOff: arguments[3] == "floor-task")
    } catch {
        FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
        exit(1)
    }
case "serve":
    let options: ConnectionOptions
    switch arguments[3] {
    case "on-loop": options = .defaults { $0.onLoopRequestHandler = { _, payload in payload }; $0.waitStrategy = engineWaitStrategy }
    case "task": options = .defaults { $0.requestHandler = { _, payload in payload }; $0.waitStrategy = engineWaitStrategy }
    case "sink":
        // Touched only on the connection's loop: the handlers below both run there.
        final class Taken: @unchecked Sendable { var messages: UInt64 = 0 }
        let taken = Taken()
        options = .defaults {
            $0.makeOnLoopBorrowingMessageHandler = {
                { msgid, _, _ in
                    guard msgid == streamMessage else { return false }
                    taken.messages += 1
                    return true
                }
            }
            $0.onLoopRequestHandler = { _, _ in withUnsafeBytes(of: taken.messages.bigEndian) { Array($0) } }
        }
    default: usage()
    }
    runAndWait { [options] in try await serveOneClient(transport, options: options) }
case "client" where arguments.count == 6 && arguments[5] == "stream":
    guard let count = Int(arguments[3]), count >= 0, let size = Int(arguments[4]), size >= 0 else { usage() }
    runAndWait {
        let connection = try await connectRetrying(transport, to: endpoint)
        defer { connection.invalidate() }
        let payload = [UInt8](repeating: 0x5A, count: size)
        try await withTaskExecutorPreference(connection.preferredTaskExecutor) {
            let start = RoundTripTimes.now()
            for _ in 0..<count {
                try await connection.send(payload, msgid: streamMessage, timeout: .seconds(60))
            }
            let reply = try await connection.request([], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
            // Until the server has taken every message (it answers the request after them).
            if RoundTripTimes.enabled { print("stream \(count) messages \(RoundTripTimes.now() - start) ns") }
            let taken = reply.count == 8 ? reply.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } : nil
            guard taken == UInt64(count) else {
                throw IPCError(code: .malformedPayload, message: "the server took \(taken.map(String.init) ?? "an unreadable count of") messages of \(count)")
            }
        }
    }
case "client" where arguments.count == 6 && arguments[5] == "floor-stream":
    guard let count = Int(arguments[3]), count >= 0, let size = Int(arguments[4]), size >= 0, size <= Int(UInt32.max) else { usage() }
    do {
        try runFloorStreamClient(path: arguments[2] + "/echo.sock", count: count, size: size)
    } catch {
        FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
        exit(1)
    }
case "client" where arguments.count == 6 && arguments[5] != "engine":
    guard let count = Int(arguments[3]), count >= 0, let size = Int(arguments[4]), size >= 0, ["floor", "floor-cancellable"].contains(arguments[5]) else { usage() }
    do {
        // The script starts a client once the socket exists; it still retries a refused connect.
        try runFloorClient(path: arguments[2] + "/echo.sock", count: count, size: size, cancellable: arguments[5] == "floor-cancellable")
    } catch {
        FileHandle.standardError.write(Data("round-trip-instructions: \(error)\n".utf8))
        exit(1)
    }
case "client":
    guard (5...6).contains(arguments.count), let count = Int(arguments[3]), count >= 0, let size = Int(arguments[4]), size >= 0 else { usage() }
    runAndWait {
        let connection = try await connectRetrying(transport, to: endpoint)
        defer { connection.invalidate() }
        let payload = [UInt8](repeating: 0xA5, count: size)
        try await withTaskExecutorPreference(connection.preferredTaskExecutor) {
            var times = RoundTripTimes(count: count)
            for _ in 0..<count {
                let start = RoundTripTimes.now()
                let reply = try await connection.request(payload, msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
                times.record(since: start)
                guard reply.count == size else {
                    throw IPCError(code: .malformedPayload, message: "the echo of \(size) bytes came back with \(reply.count)")
                }
            }
            times.report()
        }
    }
default:
    usage()
}
