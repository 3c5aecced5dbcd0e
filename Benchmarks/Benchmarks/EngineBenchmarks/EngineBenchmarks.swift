import Benchmark
import BenchmarkSupport
import Foundation
import IPCCore
import NotifyTransport
import UnixSocketTransport

/// Request/reply through the connection engine, with both ends in this process: a listener that
/// echoes on the receive path and a client whose task prefers the connection's event loop. Both
/// ends share the process's one loop thread, so a round trip is the engine's whole path on one
/// thread (send, poll, read, reassemble, dispatch, reply, read, resume) with the kernel's work
/// but no wake-up of another thread.
///
/// The figure to watch is allocations per round trip, held by the thresholds: the request's
/// payload array on the listener's side and the reply's on the client's (2), nothing else. The
/// times are the engine's CPU per round trip on one thread; the harness (`ipcbench run`) measures
/// round trips between processes.
let benchmarks: @Sendable () -> Void = {
    // The thresholds are 2,000 allocations per 1,000 round trips. A few of the runtime's own
    // now and then (about 5 per 1,000 here) are let through; one more per round trip is not.
    Benchmark.defaultConfiguration = suiteConfiguration(tolerance: 200)

    let transports: [(name: String, make: @Sendable () -> any MessageTransport)] = [
        ("unix-socket", { UnixSocketTransport(framing: .binary) }),
        ("notify", { NotifyTransport() }),
    ]
    for transport in transports {
        for size in [64, 4096] {
            let pair = EchoPair()
            Benchmark(
                "RoundTrip.\(transport.name).\(sizeLabel(size))",
                configuration: .init(scalingFactor: .kilo),
                closure: { benchmark in
                    try await pair.roundTrips(benchmark.scaledIterations.count, size: size)
                },
                setup: { try pair.open(transport.make()) },
                teardown: { pair.close() }
            )
        }
    }
}

/// A listener that echoes and one client connected to it, in a group directory of their own.
final class EchoPair: @unchecked Sendable {
    // @unchecked: set in the benchmark's setup and cleared in its teardown, which
    // package-benchmark runs before and after the measured closure, never beside it.
    private var directory: String?
    private var listener: (any MessageListener)?
    private var connection: (any MessageConnection)?

    func open(_ transport: any MessageTransport) throws {
        var template = Array((NSTemporaryDirectory() + "ipcbench-engine-XXXXXX").utf8CString)
        guard let path = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw IPCError(code: .transportFailure, message: "mkdtemp failed: errno \(errno)")
        }
        let directory = String(cString: path)
        self.directory = directory
        let endpoint = try Endpoint(group: GroupDirectory(path: directory), name: "echo")
        listener = try transport.listen(
            at: endpoint,
            // The on-loop fast path: the benchmark times the engine's own path on one thread.
            options: .defaults { $0.onLoopRequestHandler = { _, payload in payload } },
            acceptFilter: nil
        )
        connection = try transport.connect(to: endpoint, options: .defaults)
    }

    /// `count` requests of `size` bytes, each awaited before the next, on the loop's thread.
    func roundTrips(_ count: Int, size: Int) async throws {
        guard let connection else { throw IPCError(code: .invalidated, message: "not connected") }
        let payload = [UInt8](repeating: 0xA5, count: size)
        try await withTaskExecutorPreference(connection.preferredTaskExecutor) {
            for _ in 0..<count {
                let reply = try await connection.request(payload, msgid: 1, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
                guard reply.count == size else {
                    throw IPCError(code: .malformedPayload, message: "the echo of \(size) bytes came back with \(reply.count)")
                }
            }
        }
    }

    func close() {
        connection?.invalidate()
        listener?.close()
        connection = nil
        listener = nil
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
        directory = nil
    }
}
