import Foundation
public import IPCCore
import Synchronization
public import Testing

/// A private group directory for one test, removed afterwards.
public struct TestGroup: ~Copyable {
    public let directory: GroupDirectory

    public init() throws {
        var template = Array((NSTemporaryDirectory() + "ipcbench-test-XXXXXX").utf8CString)
        let path = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        directory = GroupDirectory(path: String(cString: try #require(path)))
    }

    public func endpoint(_ name: String) throws -> Endpoint {
        try Endpoint(group: directory, name: name)
    }

    /// An endpoint whose name is scoped to the group (`<group identifier>.<name>`), as message
    /// ports require.
    public func scopedEndpoint(_ name: String) throws -> Endpoint {
        try Endpoint(group: directory, name: directory.identifier + "." + name)
    }

    deinit {
        Self.remove(directory.path)
    }

    /// Removes the directory and what is in it. Connections that end as the test ends remove
    /// their own files meanwhile (a removal that meets one gone fails), and a listener's
    /// asynchronous goodbye may still write one: tried again for up to 2 s, so nothing is left
    /// in the temporary directory (`.ci/run` counts what is).
    static func remove(_ path: String) {
        for _ in 0..<40 {
            try? FileManager.default.removeItem(atPath: path)
            guard FileManager.default.fileExists(atPath: path) else { return }
            usleep(50_000)
        }
    }
}

/// Records invalidation: how often the handler ran, with what reason, and when.
public final class InvalidationProbe: Sendable {
    private let state = Mutex<(count: Int, reason: InvalidationReason?)>((0, nil))
    private let fired = DispatchSemaphore(value: 0)

    public init() {}

    public func attach(to connection: some MessageConnection) {
        connection.setInvalidationHandler { [self] reason in
            state.withLock {
                $0.count += 1
                $0.reason = reason
            }
            fired.signal()
        }
    }

    /// Waits (blocking a thread, not the test's task pool) up to `seconds` for the handler.
    public func wait(seconds: Double) async -> Bool {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread { [fired] in
                continuation.resume(returning: fired.wait(timeout: .now() + seconds) == .success)
            }
        }
    }

    public var count: Int { state.withLock { $0.count } }
    public var reason: InvalidationReason? { state.withLock { $0.reason } }
}

/// Runs `body` with a deadline, failing the test instead of hanging it.
public func withDeadline<T: Sendable>(seconds: Double, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            return nil
        }
        guard let first = try await group.next(), let value = first else {
            group.cancelAll()
            throw IPCError(code: .receiveTimeout, message: "\(what) did not finish within \(seconds) s")
        }
        group.cancelAll()
        return value
    }
}

/// Collects the next `count` messages from a connection, with a deadline.
public func collect(_ count: Int, from connection: some MessageConnection, seconds: Double = 30) async throws -> [ReceivedMessage] {
    let messages = connection.messages
    return try await withDeadline(seconds: seconds, "receiving \(count) messages") {
        var received: [ReceivedMessage] = []
        for await message in messages {
            received.append(message)
            if received.count == count { break }
        }
        return received
    }
}

public func expectIPCError<T>(_ code: IPCError.Code, _ body: () async throws -> T, sourceLocation: SourceLocation = #_sourceLocation) async {
    do {
        _ = try await body()
        Issue.record("expected IPCError \(code), but the call succeeded", sourceLocation: sourceLocation)
    } catch let error as IPCError {
        #expect(error.code == code, "got \(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected IPCError \(code), got \(error)", sourceLocation: sourceLocation)
    }
}

/// The outcome of `body`, or a timeout error after `seconds`.
public func withDeadlineResult<T: Sendable>(seconds: Double, _ body: @escaping @Sendable () async throws -> T) async -> Result<T, any Error> {
    do {
        return .success(try await withDeadline(seconds: seconds, "operation", body))
    } catch {
        return .failure(error)
    }
}

/// A small seeded generator (SplitMix64): "random" inputs that are the same every run, so a
/// failure can be replayed from its seed.
public struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A value shared between threads under a lock.
public final class LockedValue<Value: Sendable>: Sendable {
    private let value: Mutex<Value>

    public init(_ value: Value) { self.value = Mutex(value) }

    public func get() -> Value { value.withLock { $0 } }

    public func set(_ newValue: Value) { value.withLock { $0 = newValue } }

    public func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> T { try value.withLock(body) }
}

/// The next connection `listener` accepts, within `seconds`.
public func acceptOne<Listener: MessageListener>(_ listener: Listener, seconds: Double = 30) async throws -> Listener.Connection {
    let connections = listener.connections
    return try await withDeadline(seconds: seconds, "accepting a client") {
        for await connection in connections { return connection }
        throw IPCError(code: .endpointNotFound, message: "the listener closed")
    }
}

/// Sends `perClient` requests from every client at once (payloads that name their client and
/// index, of growing sizes, up to about 8 KiB) with `msgid`, to a peer that echoes them, and
/// expects each reply to be its own request's payload.
public func expectConcurrentEchoes(from clients: [some MessageConnection], msgid: UInt32, perClient: Int = 40) async throws {
    try await withThrowingTaskGroup(of: Void.self) { tasks in
        for (clientIndex, client) in clients.enumerated() {
            for index in 0..<perClient {
                tasks.addTask {
                    let payload = Array("client \(clientIndex) request \(index)".utf8) + [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: index * 211)
                    let reply = try await client.request(payload, msgid: msgid, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
                    #expect(reply == payload, "client \(clientIndex) request \(index)")
                }
            }
        }
        try await tasks.waitForAll()
    }
}

/// Checks `condition` every 10 ms until it holds or `seconds` pass (suspending, never blocking
/// a thread); returns whether it held.
public func poll(seconds: Double, _ condition: @escaping @Sendable () -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while ContinuousClock.now < deadline {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

/// Stops process `pid` with SIGSTOP and waits (up to 10 s) until the kernel reports it stopped
/// (`T` in `/proc/<pid>/stat`): `kill` returns once the signal is queued, and on a loaded machine
/// the process may run a while longer. Whether it was seen stopped.
public func stopProcess(_ pid: Int32) async -> Bool {
    guard kill(pid, SIGSTOP) == 0 else { return false }
    return await poll(seconds: 10) { isStopped(pid) }
}

/// Whether process `pid` is stopped by a signal (`T` in `/proc/<pid>/stat`).
public func isStopped(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let end = stat.lastIndex(of: ")")
    else { return false }
    // "pid (comm) S ...": the state follows the command's closing parenthesis.
    return stat[stat.index(after: end)...].dropFirst().first == "T"
}
