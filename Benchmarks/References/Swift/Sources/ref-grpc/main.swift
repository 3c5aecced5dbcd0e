// ref-grpc: gRPC over a Unix domain socket with grpc-swift 2 and its NIO (Posix) HTTP/2
// transport, as a reference system of ipcbench (system "grpc"). No protobuf and no generated
// code: messages are raw bytes ([UInt8]) with a hand-written serializer and deserializer, and the
// method descriptors are written by hand.
//
//   /ipcbench.Echo/Echo  unary: the request's bytes come back (latency).
//   /ipcbench.Echo/Push  client streaming: N messages one way; the single response, sent once
//                        the server has taken and checked the last one, carries (taken,
//                        mismatched) as two big-endian UInt64s: the receiver's acknowledgement
//                        (throughput). The payload size travels as metadata "ipcbench-payload".
//
// Configured for latency as a user would (what was tried, and what each setting cost, is in
// ../../README.md, "Why grpc-swift is slow here"): each process has one event-loop thread of its
// own, and the RPC code (the server's handlers, the client's calls) runs on that thread through a
// task executor preference, instead of hopping between the event loop and Swift Concurrency's
// global pool for every message; and the HTTP/2 window is raised for large messages.
// The command-line contract is in ../../README.md.
import GRPCCore
import GRPCNIOTransportHTTP2Posix
import NIOCore
import NIOPosix
import RefCommon

#if canImport(Glibc)
import Glibc
#endif

let arguments = Arguments.parse(systems: ["grpc"])
let socketName = "grpc.sock"
/// Above the 4 MiB default, so that every payload up to --payload's limit is carried.
let maxMessageBytes = 80 << 20
/// HTTP/2 flow-control window of each stream and the connection, both ways: 64 MiB instead of the
/// transport's 8 MiB default, which held 64 KiB and 1 MiB messages to a tenth of this speed (README).
let windowBytes = 64 << 20

/// The process's one event loop: the transport's connections run on it, and so does the RPC code.
let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
let loopExecutor = EventLoopTaskExecutor(group.next())

/// A task executor that runs jobs on a NIO event loop, so that a task preferring it (and every
/// child task) runs on the thread that does the I/O. NIO 2.101 has none to offer, so here it is.
final class EventLoopTaskExecutor: TaskExecutor, @unchecked Sendable {
    let loop: any EventLoop
    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        loop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

let echoMethod = MethodDescriptor(fullyQualifiedService: "ipcbench.Echo", method: "Echo")
let pushMethod = MethodDescriptor(fullyQualifiedService: "ipcbench.Echo", method: "Push")

struct BytesSerializer: MessageSerializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Bytes {
        Bytes(message)
    }
}

struct BytesDeserializer: MessageDeserializer {
    func deserialize<Bytes: GRPCContiguousBytes>(_ serializedMessageBytes: Bytes) throws -> [UInt8] {
        serializedMessageBytes.withUnsafeBytes { [UInt8]($0) }
    }
}

// MARK: - Server

struct EchoService: RegistrableRPCService {
    let corrupt: Bool

    func registerMethods<Transport: ServerTransport>(with router: inout RPCRouter<Transport>) {
        let corrupt = self.corrupt
        router.registerHandler(
            forMethod: echoMethod,
            deserializer: BytesDeserializer(),
            serializer: BytesSerializer()
        ) { request, _ in
            let single = try await ServerRequest(stream: request)
            let echo = corrupt ? single.message.withUnsafeBytes { Pattern.corrupted($0) } : single.message
            return StreamingServerResponse(single: ServerResponse(message: echo))
        }
        router.registerHandler(
            forMethod: pushMethod,
            deserializer: BytesDeserializer(),
            serializer: BytesSerializer()
        ) { request, _ in
            guard let text = request.metadata[stringValues: "ipcbench-payload"].first(where: { _ in true }),
                let payload = Int(text), payload >= 0
            else {
                throw RPCError(code: .invalidArgument, message: "metadata ipcbench-payload is missing")
            }
            let pattern = Pattern(payload: payload)
            var taken: UInt64 = 0
            var mismatched: UInt64 = 0
            for try await message in request.messages {
                let k = Int(taken)
                if !message.withUnsafeBytes({ pattern.check(k, $0) }) { mismatched += 1 }
                taken += 1
            }
            var ack: [UInt8] = []
            for value in [taken, mismatched] {
                for shift in stride(from: 56, through: 0, by: -8) { ack.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
            }
            return StreamingServerResponse(single: ServerResponse(message: ack))
        }
    }
}

func serve() async -> Never {
    Reference.catchStopSignals()
    let path = Reference.path(socketName)
    let transport = HTTP2ServerTransport.Posix(
        address: .unixDomainSocket(path: path),
        transportSecurity: .plaintext,
        config: .defaults {
            $0.rpc.maxRequestPayloadSize = maxMessageBytes
            $0.http2.targetWindowSize = windowBytes
        },
        eventLoopGroup: group
    )
    let server = GRPCServer(transport: transport, services: [EchoService(corrupt: arguments.corrupt)])
    let serving = Task {
        do {
            try await withTaskExecutorPreference(loopExecutor) { try await server.serve() }
        } catch {
            Reference.exit(error, context: "gRPC server on \(path)")
        }
    }
    do {
        _ = try await transport.listeningAddress
    } catch {
        Reference.exit(error, context: "cannot listen on \(path)")
    }
    Reference.ready()
    Reference.waitForStop()  // blocks this (the main) thread; the server runs on its own threads
    unlink(path)
    Reference.exitLater(milliseconds: 2000, status: 0)
    server.beginGracefulShutdown()
    await serving.value
    exit(0)
}

// MARK: - Client

func measure() async -> Never {
    Reference.startWatchdog()
    let path = Reference.path(socketName)
    Reference.requireSocket(path)
    let pattern = Pattern(payload: arguments.payload)
    let (warmup, count, corrupt) = (arguments.warmup, arguments.count, arguments.corrupt)
    var options = CallOptions.defaults
    options.maxRequestMessageBytes = maxMessageBytes
    options.maxResponseMessageBytes = maxMessageBytes
    options.waitForReady = false

    do {
        let transport = try HTTP2ClientTransport.Posix(
            target: .unixDomainSocket(path: path),
            transportSecurity: .plaintext,
            config: .defaults { $0.http2.targetWindowSize = windowBytes },
            eventLoopGroup: group
        )
        try await withTaskExecutorPreference(loopExecutor) {
            try await withGRPCClient(transport: transport) { client in
                switch arguments.mode {
                case .latency:
                    var unaryOptions = options
                    unaryOptions.timeout = .seconds(10)
                    var samples: [UInt64] = []
                    samples.reserveCapacity(count)
                    for k in 0..<(warmup + count) {
                        if k == warmup { Reference.startAccounting() }
                        let request = ClientRequest(message: [UInt8](pattern.message(k)))
                        let start = Reference.now()
                        let echo = try await client.unary(
                            request: request,
                            descriptor: echoMethod,
                            serializer: BytesSerializer(),
                            deserializer: BytesDeserializer(),
                            options: unaryOptions
                        ) { response in try response.message }
                        let end = Reference.now()
                        try echo.withUnsafeBytes { bytes in
                            guard pattern.check(k, bytes) else {
                                throw ReferenceFailure("wrong echo: \(pattern.describeMismatch(k, bytes))")
                            }
                        }
                        if k >= warmup { samples.append(Reference.sample(from: start, to: end)) }
                        Reference.progress()
                    }
                    Reference.stopAccounting()
                    Reference.printLatency(samples: samples)

                case .throughput:
                    // One client-streaming call per phase: the warmup (untimed), then the timed one.
                    func push(_ messages: Int, corruptFirst: Bool) async throws {
                        let request = StreamingClientRequest<[UInt8]>(metadata: ["ipcbench-payload": "\(pattern.payload)"]) {
                            writer in
                            for k in 0..<messages {
                                if k == 0 && corruptFirst {
                                    try await writer.write(Pattern.corrupted(pattern.message(0)))
                                } else {
                                    try await writer.write([UInt8](pattern.message(k)))
                                }
                                Reference.progress()
                            }
                        }
                        let ack = try await client.clientStreaming(
                            request: request,
                            descriptor: pushMethod,
                            serializer: BytesSerializer(),
                            deserializer: BytesDeserializer(),
                            options: options
                        ) { response in try response.message }
                        guard ack.count == 16 else { throw ReferenceFailure("unexpected acknowledgement of \(ack.count) bytes") }
                        let taken = ack[0..<8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                        let mismatched = ack[8..<16].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                        if mismatched != 0 { throw ReferenceFailure("the receiver found \(mismatched) of \(taken) messages wrong") }
                        if taken != UInt64(messages) {
                            throw ReferenceFailure("the receiver took \(taken) messages, expected \(messages)")
                        }
                        Reference.progress()
                    }
                    if warmup > 0 { try await push(warmup, corruptFirst: false) }
                    Reference.startAccounting()
                    let start = Reference.now()
                    try await push(count, corruptFirst: corrupt)
                    let end = Reference.now()
                    Reference.stopAccounting()
                    Reference.printThroughput(elapsedNs: Reference.sample(from: start, to: end))
                }
            }
        }
    } catch {
        Reference.exit(error, context: "gRPC")
    }
    exit(0)
}

switch arguments.command {
case .serve: await serve()
case .measure: await measure()
}
