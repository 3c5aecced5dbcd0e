// A temporary client and server for Reports/throughput-volume (not part of the package): a
// stream's start-up after round trips, outside the harness. Built in place of
// Benchmarks/RoundTripInstructions/Sources/round-trip-instructions/main.swift, with that folder's
// SwiftFloor.swift and SwiftFloorStream.swift moved aside:
//   BIN serve GROUP task|on-loop
//   [RTX_VARIANT=same|other|sleep|spin] BIN client GROUP REPETITIONS ROUND_TRIPS ROUND_TRIP_BYTES MESSAGES MESSAGE_BYTES
// RTX_VARIANT: the round trips on the stream's connection (same, the default) or on a second one
// (other); or instead of them, sleep (usleep) or spin for ROUND_TRIPS microseconds.
import Dispatch
import Foundation
import IPCCore
import Synchronization
import UnixSocketTransport

func runAndWait(_ body: @escaping @Sendable () async throws -> Void) {
    let done = DispatchSemaphore(value: 0)
    Task {
        do { try await body() } catch { FileHandle.standardError.write(Data("rtx: \(error)\n".utf8)); exit(1) }
        done.signal()
    }
    done.wait()
}
func usage() -> (Int, Int, Int) { var u = rusage(); getrusage(RUSAGE_SELF.rawValue, &u); return (Int(u.ru_nvcsw) + Int(u.ru_nivcsw), Int(u.ru_utime.tv_sec) * 1_000_000 + Int(u.ru_utime.tv_usec), Int(u.ru_stime.tv_sec) * 1_000_000 + Int(u.ru_stime.tv_usec)) }
func now() -> UInt64 { var t = timespec(); clock_gettime(CLOCK_MONOTONIC, &t); return UInt64(t.tv_sec) * 1_000_000_000 + UInt64(t.tv_nsec) }

let a = CommandLine.arguments
let endpoint = try! Endpoint(group: GroupDirectory(path: a[2]), name: "echo")
let transport = UnixSocketTransport(framing: .binary)
let taken = Atomic<UInt64>(0)

switch a[1] {
case "serve":
    // a[3]: task | on-loop (how requests are answered)
    let onLoop = a[3] == "on-loop"
    let options = ConnectionOptions.defaults {
        $0.makeOnLoopBorrowingMessageHandler = {
            { msgid, _, _ in
                guard msgid == 2 else { return false }
                taken.add(1, ordering: .relaxed)
                return true
            }
        }
        if onLoop {
            $0.onLoopRequestHandler = { msgid, payload in msgid == 3 ? payload : withUnsafeBytes(of: taken.exchange(0, ordering: .relaxed).bigEndian) { Array($0) } }
        } else {
            $0.requestHandler = { msgid, payload in msgid == 3 ? payload : withUnsafeBytes(of: taken.exchange(0, ordering: .relaxed).bigEndian) { Array($0) } }
        }
        $0.maximumPayloadLength = 1 << 30
    }
    runAndWait {
        let listener = try transport.listen(at: endpoint, options: options, acceptFilter: nil)
        defer { listener.close() }
        for await connection in listener.connections {
            Task { for await _ in connection.messages {}; exit(0) }
        }
    }
case "client":
    // reps, round trips, round-trip size, stream messages, stream size
    let reps = Int(a[3])!, trips = Int(a[4])!, tripSize = Int(a[5])!, count = Int(a[6])!, size = Int(a[7])!
    runAndWait {
        var connection: (any MessageConnection)?
        for _ in 0..<6000 {
            do { connection = try await transport.connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = 1 << 30 }); break } catch { try await Task.sleep(for: .milliseconds(20)) }
        }
        guard let connection else { throw IPCError(code: .endpointNotFound, message: "no server") }
        let other: (any MessageConnection)? = ProcessInfo.processInfo.environment["RTX_VARIANT"] == "other" ? try await transport.connect(to: endpoint, options: .defaults { $0.maximumPayloadLength = 1 << 30 }) : nil
        defer { connection.invalidate() }
        try await withTaskExecutorPreference(connection.preferredTaskExecutor) {
            let tripPayload = [UInt8](repeating: 0xA5, count: tripSize)
            let payload = [UInt8](repeating: 0x5A, count: size)
            for rep in 0..<reps {
                let variant = ProcessInfo.processInfo.environment["RTX_VARIANT"] ?? "same"
                // `sleep` and `spin` block the client's event-loop thread on purpose, as the
                // experiment's stand-ins for idle and busy time: this task is the only work of that
                // thread (no reply is due, nothing else is connected). Not a pattern for real code,
                // where `Task.sleep` is the wait that leaves the loop free.
                if variant == "sleep" { usleep(UInt32(trips)) }
                else if variant == "spin" { let until = now() + UInt64(trips) * 1000; while now() < until {} }
                else {
                    let on = variant == "other" ? other! : connection
                    for _ in 0..<trips {
                        let reply = try await on.request(tripPayload, msgid: 3, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
                        precondition(reply.count == tripSize)
                    }
                }
                // a short warm-up stream, as the harness's
                for _ in 0..<3 { try await connection.send(payload, msgid: 2, timeout: .seconds(60)) }
                _ = try await connection.request([], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
                var marks: [UInt64] = []
                marks.reserveCapacity(count)
                var us: [(Int, Int, Int)] = [usage()]
                let start = now()
                for i in 0..<count {
                    try await connection.send(payload, msgid: 2, timeout: .seconds(60))
                    marks.append(now())
                    if i == 9 || i == 29 || i == 39 { us.append(usage()) }
                }
                let reply = try await connection.request([], msgid: 1, sendTimeout: .seconds(60), receiveTimeout: .seconds(60))
                let total = now() - start
                let n = reply.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                precondition(n == UInt64(count), "took \(n)")
                if rep > 0 { print("WIN \(start) \(marks[9]) \(marks[29]) \(marks[39])") }
                if rep > 0 { print("USAGE first10 cs \(us[1].0 - us[0].0) user \(us[1].1 - us[0].1) sys \(us[1].2 - us[0].2) | 30-40 cs \(us[3].0 - us[2].0) user \(us[3].1 - us[2].1) sys \(us[3].2 - us[2].2)") }
                if rep > 0 { print("MARKS size=\(size) n=\(count) " + marks.map { String(($0 - start) / 1000) }.joined(separator: ",") + " report=\(total / 1000)") }
            }
        }
    }
default: fatalError("usage")
}
