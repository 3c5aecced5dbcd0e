import Foundation
public import IPCCore
import Synchronization

/// The peer side of the suite: what the process at the other end of every case does.
///
/// Requests are answered by msgid (``Request``); one-way messages are echoed back as one-way
/// messages with the same msgid, which lets a case check delivery end to end, except the
/// ``Sink`` msgids, which count one-way messages for throughput measurements. A peer runs until
/// its connection ends (client role) or its standard input closes: standard input is a pipe from
/// the process that started it, so a peer never outlives the suite.
///
/// A peer executable for a new transport is a few lines:
///
///     import IPCConformance
///
///     @main struct ToyPeer {
///         static func main() async { await ConformancePeer.main(transport: ToyTransport()) }
///     }
public struct ConformancePeer: Sendable {
    /// The msgids of the requests a peer answers.
    public enum Request {
        /// Reply with the request's payload.
        public static let echo: UInt32 = 1
        /// Never reply: the request stays pending until the peer dies, the connection ends (which
        /// cancels the handler: see ``cancelledHandlers``) or the requester times out. With the
        /// serial default, the connection's later requests wait behind it; its one-way messages,
        /// other connections and new clients are served as usual.
        public static let stall: UInt32 = 2
        /// Fail the request (the requester gets ``IPCError/Code/transportFailure``).
        public static let fail: UInt32 = 3
        /// Reply with the payload after a delay: the payload's first 4 bytes (big-endian) give
        /// the delay in milliseconds, at most ``maximumDelayMilliseconds`` (larger values are
        /// clamped to it: any value a client sends is handled).
        public static let delayedEcho: UInt32 = 4
        /// The longest delay a delayed echo waits.
        public static let maximumDelayMilliseconds: UInt32 = 60_000
        /// Reply with the number of this peer's request handlers (``stall``s and
        /// ``delayedEcho``s) whose task was cancelled before they were done, because their
        /// connection ended: 8 bytes, big-endian. A peer serving on the loop counts none.
        public static let cancelledHandlers: UInt32 = 5
        /// Reply with what the peer's event loop counted as stalls (JSON: `count`,
        /// `longestMilliseconds`, `culprits`), or an empty payload if the peer does not count them
        /// (``ConformancePeer/loopStalls``).
        public static let loopStalls: UInt32 = 6
    }

    /// Handlers of this process cancelled before they were done (``Request/cancelledHandlers``).
    private static let cancellations = Mutex<UInt64>(0)

    /// The msgids of one-way messages a peer does not echo: the receiving end of a one-way
    /// throughput measurement.
    public enum Sink {
        /// Counted and dropped.
        public static let message: UInt32 = 0xFFFF_FF00
        /// Ends a run of ``message``s: the peer answers with one ``report`` message once its
        /// receive path has handed everything sent before to its handler (``makeHandler(allocationCount:)``).
        public static let end: UInt32 = 0xFFFF_FF01
        /// The peer's answer to ``end``: since the previous report, the number of ``message``s,
        /// of their payload bytes, and of heap allocations made on the receive path while taking
        /// them (``unknownAllocations`` if the peer does not count them, or if the messages did
        /// not all arrive on one thread): three 8-byte big-endian integers. A report of two
        /// (16 bytes, from a peer before allocations were counted) is read as allocations unknown.
        public static let report: UInt32 = 0xFFFF_FF02
        /// The allocation count of a report that has none.
        public static let unknownAllocations = UInt64.max

        /// A per-connection handler that takes ``message``s in place (a
        /// ``BorrowingMessageHandler``: no copy of the payload, no allocation) and answers
        /// ``end``, on the receive path: a measurement then times the transport and its hand-over
        /// to application code, not the wake-up of a task that drains
        /// ``MessageConnection/messages``. `allocationCount` gives the calling thread's identity and
        /// its heap allocations so far (`nil`: not counted).
        public static func makeHandler(allocationCount: (@Sendable () -> (thread: UInt64, allocations: UInt64))? = nil) -> BorrowingMessageHandler {
            struct Counts {
                var messages: UInt64 = 0
                var bytes: UInt64 = 0
                /// The thread and its allocation count at the first message since the last report.
                var first: (thread: UInt64, allocations: UInt64)?
                var oneThread = true
            }
            let counts = Mutex(Counts())
            return { msgid, payload, send in
                switch msgid {
                case Sink.message:
                    let reading = allocationCount?()
                    counts.withLock { counts in
                        counts.messages += 1
                        counts.bytes += UInt64(payload.byteCount)
                        if let reading {
                            if let first = counts.first {
                                if first.thread != reading.thread { counts.oneThread = false }
                            } else {
                                counts.first = reading
                            }
                        }
                    }
                    return true
                case Sink.end:
                    // The allocations up to this message: taking `end` itself allocates nothing
                    // before this reading.
                    let reading = allocationCount?()
                    let sunk = counts.withLock { counts in
                        defer { counts = Counts() }
                        return counts
                    }
                    var allocations = unknownAllocations
                    if let reading, let first = sunk.first, sunk.oneThread, first.thread == reading.thread, reading.allocations >= first.allocations {
                        allocations = reading.allocations - first.allocations
                    }
                    try? send(makeReport(messages: sunk.messages, bytes: sunk.bytes, allocations: allocations), report)
                    return true
                default:
                    return false
                }
            }
        }

        /// Reads a ``report`` payload.
        public static func parseReport(_ payload: [UInt8]) -> (messages: UInt64, bytes: UInt64, allocations: UInt64?)? {
            guard payload.count == 16 || payload.count == 24 else { return nil }
            let values = stride(from: 0, to: payload.count, by: 8).map { start in payload[start..<start + 8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
            let allocations = values.count == 3 && values[2] != unknownAllocations ? values[2] : nil
            return (values[0], values[1], allocations)
        }

        static func makeReport(messages: UInt64, bytes: UInt64, allocations: UInt64) -> [UInt8] {
            [messages, bytes, allocations].flatMap { withUnsafeBytes(of: $0.bigEndian, Array.init) }
        }
    }

    public var transport: any MessageTransport
    public var configuration: Configuration
    /// The calling thread's identity and heap allocations so far, for the ``Sink`` reports
    /// (`nil`: the peer does not count allocations, and its reports say so).
    public var allocationCount: (@Sendable () -> (thread: UInt64, allocations: UInt64))?
    /// The answer to ``Request/loopStalls`` (`nil`: an empty payload).
    public var loopStalls: (@Sendable () -> [UInt8])?

    public init(
        transport: any MessageTransport, configuration: Configuration, allocationCount: (@Sendable () -> (thread: UInt64, allocations: UInt64))? = nil,
        loopStalls: (@Sendable () -> [UInt8])? = nil
    ) {
        self.transport = transport
        self.configuration = configuration
        self.allocationCount = allocationCount
        self.loopStalls = loopStalls
    }

    /// Parses the command line (``Configuration/init(arguments:)``), runs the peer, and exits
    /// with status 1 and a message on standard error if anything fails.
    public static func main(transport: any MessageTransport, arguments: [String] = Array(CommandLine.arguments.dropFirst())) async {
        do {
            let configuration = try Configuration(arguments: arguments)
            try await ConformancePeer(transport: transport, configuration: configuration).run()
        } catch {
            FileHandle.standardError.write(Data("peer: \(error)\n".utf8))
            exit(1)
        }
    }

    /// The payload of message `index` of a burst: the index (4 bytes, big-endian), padded with
    /// copies of its low byte to `size` bytes.
    public static func burstPayload(_ index: Int, size: Int) -> [UInt8] {
        var payload = withUnsafeBytes(of: UInt32(truncatingIfNeeded: index).bigEndian, Array.init)
        payload += [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: max(0, size - 4))
        return payload
    }

    /// The request handler a peer serves with (``Configuration/serving``: a task off the loop).
    /// Its waits suspend: a stalled or delayed request holds up its own connection only.
    public static let requestHandler: RequestHandler = { msgid, payload in
        switch msgid {
        case Request.stall:
            try await untilCancelled { while true { try await Task.sleep(for: .seconds(3600)) } }
            return nil
        case Request.fail:
            throw IPCError(code: .unsupportedOperation, message: "request failed on purpose")
        case Request.delayedEcho:
            let requested = payload.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            try await untilCancelled { try await Task.sleep(for: .milliseconds(min(requested, Request.maximumDelayMilliseconds))) }
            return payload
        case Request.cancelledHandlers:
            return withUnsafeBytes(of: cancellations.withLock { $0 }.bigEndian, Array.init)
        default:
            return payload
        }
    }

    /// ``Configuration/Serving/blockingOnLoop``: what not to do, for the broken-transport tests.
    static let blockingOnLoopRequestHandler: OnLoopRequestHandler = { msgid, payload in
        switch msgid {
        case Request.stall:
            while true { sleep(3600) }
        case Request.delayedEcho:
            let requested = payload.prefix(4).reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            usleep(min(requested, Request.maximumDelayMilliseconds) * 1000)
            return payload
        default:
            return try onLoopRequestHandler(msgid, payload)
        }
    }

    /// Runs `wait`, counting its cancellation (``Request/cancelledHandlers``).
    private static func untilCancelled(_ wait: () async throws -> Void) async throws {
        do {
            try await wait()
        } catch is CancellationError {
            cancellations.withLock { $0 += 1 }
            throw CancellationError()
        }
    }

    /// The on-loop fast path a peer serves with when asked (``Configuration/Serving/onLoop``): it
    /// answers echoes and failures at once, and refuses what would make the loop wait.
    public static let onLoopRequestHandler: OnLoopRequestHandler = { msgid, payload in
        switch msgid {
        case Request.fail:
            throw IPCError(code: .unsupportedOperation, message: "request failed on purpose")
        case Request.stall, Request.delayedEcho:
            throw IPCError(code: .unsupportedOperation, message: "a peer serving on the loop does not wait (msgid \(msgid)): it would stall every connection")
        case Request.cancelledHandlers:
            return withUnsafeBytes(of: UInt64(0).bigEndian, Array.init)
        default:
            return payload
        }
    }

    /// Runs until the connection ends (client role) or standard input closes.
    /// - Throws: what the transport's `listen` or `connect` throws; ``IPCError/Code/transportFailure``
    ///   if a grandchild cannot be started.
    public func run() async throws {
        // A test instrument: it accepts whatever size a case sends (1 GiB), so that limits are
        // exercised on the side under test.
        let options = ConnectionOptions.defaults {
            let stalls = loopStalls
            switch configuration.serving {
            case .task, .taskOnLoop:
                $0.requestHandler = { msgid, payload in
                    msgid == Request.loopStalls ? stalls?() ?? [] : try await Self.requestHandler(msgid, payload)
                }
                $0.requestHandlerExecutor = configuration.serving == .task ? .servingThreads : .eventLoop
                $0.maximumConcurrentRequests = configuration.maximumConcurrentRequests
            case .onLoop, .blockingOnLoop:
                let handler = configuration.serving == .onLoop ? Self.onLoopRequestHandler : Self.blockingOnLoopRequestHandler
                $0.onLoopRequestHandler = { msgid, payload in
                    msgid == Request.loopStalls ? stalls?() ?? [] : try handler(msgid, payload)
                }
            }
            $0.maximumPayloadLength = 1 << 30
            $0.maximumConnections = configuration.maximumConnections
            $0.waitStrategy = configuration.waitStrategy
            $0.stalledFrameTimeout = configuration.stalledFrameTimeout
            $0.makeOnLoopBorrowingMessageHandler = { [allocationCount] in Sink.makeHandler(allocationCount: allocationCount) }
        }
        try await run(transport, options: options)
    }

    /// The server's accept filter: none, or one that refuses every client (`--refuse-clients`).
    private var acceptFilter: AcceptFilter? {
        guard configuration.refusesClients else { return nil }
        return { _ in false }
    }

    private func run<T: MessageTransport>(_ transport: T, options: ConnectionOptions) async throws {
        switch configuration.role {
        case .server:
            if let activation = configuration.activation {
                guard let activatable = transport as? any SocketActivatedTransport else {
                    throw IPCError(code: .unsupportedOperation, message: "\(transport.name) cannot be socket-activated: its endpoint is not a socket (message-port's is a POSIX message queue; use ServiceConnection's on-demand start)")
                }
                try await serveActivated(activatable, options: options, activation: activation)
                return
            }
            let listener = try transport.listen(at: configuration.endpoint, options: options, acceptFilter: acceptFilter)
            try announceReady()
            let echoing = Self.echoEveryConnection(of: listener)
            await Self.waitForStandardInputToClose()
            listener.close()
            // Each connection says goodbye as it ends, on the transport's own thread after the
            // close: exiting at once cut that short (clients of a message port or a file
            // presenter then learned of the end only from the process's exit). The echoes end
            // once every connection has; wait for them, at most 2 s.
            let patience = Task {
                try? await Task.sleep(for: .seconds(2))
                echoing.cancel()
            }
            await echoing.value
            patience.cancel()
        case .client:
            let connection = try await transport.connect(to: configuration.endpoint, options: options)
            try announceReady()
            let burst = Task.detached { [configuration] in
                // A burst exists to run into the receiver's backpressure, so each send waits as
                // long as the receiver takes to read (a test process starved of CPU on a loaded
                // machine has taken more than a minute); the peer ends with its standard input.
                do {
                    for index in 0..<configuration.burstCount {
                        try connection.send(Self.burstPayload(index, size: configuration.burstSize), msgid: UInt32(index), timeout: .seconds(3600))
                    }
                } catch {
                    FileHandle.standardError.write(Data("peer: the burst stopped: \(error)\n".utf8))
                }
            }
            // Echo until the connection ends or standard input closes.
            let echo = Task { await Self.echoMessages(on: connection) }
            Task.detached {
                await Self.waitForStandardInputToClose()
                echo.cancel()
            }
            await echo.value
            burst.cancel()
            // Invalidation finishes on the transport's own thread (a message-port client removes
            // its reply queue there): wait for it, briefly, so that exiting does not cut it short.
            let ended = DispatchSemaphore(value: 0)
            connection.setInvalidationHandler { _ in ended.signal() }
            connection.invalidate()
            _ = await withCheckedContinuation { continuation in
                Thread.detachNewThread { continuation.resume(returning: ended.wait(timeout: .now() + 5)) }
            }
        }
    }

    /// The server role under a launcher: serves on the socket it passed until idle for
    /// ``Configuration/Activation/idleExit`` (checked four times per idle period, at most every
    /// 250 ms), then exits through ``IdleClosingListener/closeIfIdle(handOver:)``, which loses
    /// no connection that arrives meanwhile.
    private func serveActivated<T: SocketActivatedTransport>(_ transport: T, options: ConnectionOptions, activation: Configuration.Activation) async throws {
        let listener = try transport.listenActivated(at: configuration.endpoint, options: options, acceptFilter: acceptFilter)
        try announceReady()
        let echoing = Self.echoEveryConnection(of: listener)
        defer {
            listener.close()
            echoing.cancel()
        }
        guard let idleExit = activation.idleExit else {
            // Until killed (the launcher's stop, or a signal).
            while true { try? await Task.sleep(for: .seconds(3600)) }
        }
        let tick = min(idleExit / 4, .milliseconds(250))
        let clock = ContinuousClock()
        var idleSince: ContinuousClock.Instant? = clock.now
        var draining = false
        while true {
            try? await Task.sleep(for: tick)
            guard listener.activeConnections.isEmpty else {
                idleSince = nil
                continue
            }
            let since = idleSince ?? clock.now
            idleSince = since
            guard draining || since.duration(to: clock.now) >= idleExit else { continue }
            if await listener.closeIfIdle(handOver: activation.handOver) { return }
            // Refusing: no new connection can come; serve the last ones, then close.
            draining = activation.handOver == .refuseNewConnections
            idleSince = nil
        }
    }

    /// Echoes the one-way messages of each connection `listener` accepts, until cancelled.
    private static func echoEveryConnection(of listener: some MessageListener) -> Task<Void, Never> {
        Task {
            await withTaskGroup(of: Void.self) { group in
                for await connection in listener.connections {
                    group.addTask { await Self.echoMessages(on: connection) }
                }
            }
        }
    }

    /// Echoes each one-way message. An echo that cannot be sent within 30 s (the other side
    /// took nothing for that long) is dropped, and said so on standard error, which the tests
    /// show with their failure.
    private static func echoMessages(on connection: some MessageConnection) async {
        for await message in connection.messages {
            do {
                try await connection.send(message.payload, msgid: message.msgid, timeout: .seconds(30))
            } catch {
                FileHandle.standardError.write(Data("peer: the echo of message \(message.msgid) was dropped: \(error)\n".utf8))
            }
        }
    }

    /// Starts the grandchild, if configured, then says READY: the grandchild then holds
    /// whatever the peer's connection or listener left it.
    private func announceReady() throws {
        let grandchild = try configuration.grandchild.map(GrandchildProcess.start)
        let announcement = Announcement(pid: getpid(), grandchildPID: grandchild)
        FileHandle.standardOutput.write(Data((announcement.line + "\n").utf8))
    }

    private static func waitForStandardInputToClose() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                var byte: UInt8 = 0
                while read(STDIN_FILENO, &byte, 1) > 0 {}
                continuation.resume()
            }
        }
    }
}
