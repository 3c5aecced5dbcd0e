// ref-nio: a length-prefixed echo over a Unix domain socket with SwiftNIO, as a reference system
// of ipcbench (system "nio"). Written the way NIO's examples write one: ServerBootstrap and
// ClientBootstrap on NIOPosix, NIOExtras' LengthFieldBasedFrameDecoder and LengthFieldPrepender
// for the framing (4-byte big-endian length, then the bytes), and channel handlers.
//
// Protocol on a connection to DIR/nio.sock, one frame per message:
//   client: "hello <latency|throughput> <payload> <warmup> <count>"   server: "ok"
//   latency:    each frame is echoed back as it came (serve --corrupt flips a byte of it).
//   throughput: the server checks each frame against the pattern and, once it has taken the
//               last frame of a phase (the warmup, then the timed one), sends
//               "ack <taken> <mismatched>": the receiver's acknowledgement.
// The command-line contract is in ../../README.md.
import NIOCore
import NIOExtras
import NIOPosix
import RefCommon

#if canImport(Glibc)
import Glibc
#endif

let arguments = Arguments.parse(systems: ["nio"])
let socketName = "nio.sock"

/// The framing every connection uses, in both directions.
func addFraming(_ pipeline: ChannelPipeline.SynchronousOperations, _ handler: any ChannelHandler) throws {
    try pipeline.addHandler(ByteToMessageHandler(LengthFieldBasedFrameDecoder(lengthFieldBitLength: .fourBytes)))
    try pipeline.addHandler(LengthFieldPrepender(lengthFieldBitLength: .fourBytes))
    try pipeline.addHandler(handler)
}

// MARK: - Server

final class EchoServerHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum Mode { case awaitingHello, latency, throughput }

    private let corrupt: Bool
    private var mode = Mode.awaitingHello
    private var pattern = Pattern(payload: 0)
    private var phases: [Int] = []
    private var phase = 0
    private var taken = 0
    private var mismatched = 0

    init(corrupt: Bool) {
        self.corrupt = corrupt
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var frame = self.unwrapInboundIn(data)
        switch self.mode {
        case .awaitingHello:
            let words = (frame.readString(length: frame.readableBytes) ?? "").split(separator: " ")
            guard words.count == 5, words[0] == "hello", let payload = Int(words[2]), let warmup = Int(words[3]),
                let count = Int(words[4]), payload >= 0, warmup >= 0, count >= 0
            else {
                context.close(promise: nil)
                return
            }
            self.pattern = Pattern(payload: payload)
            if words[1] == "throughput" {
                self.mode = .throughput
                self.phases = (warmup > 0 ? [warmup] : []) + [count]
            } else {
                self.mode = .latency
            }
            context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: "ok")), promise: nil)

        case .latency:
            if self.corrupt {
                if frame.readableBytes > 0 {
                    let index = frame.readerIndex + frame.readableBytes / 2
                    frame.setInteger(frame.getInteger(at: index, as: UInt8.self)! ^ 0xff, at: index)
                } else {
                    frame.writeInteger(UInt8(0x5a))
                }
            }
            context.write(self.wrapOutboundOut(frame), promise: nil)

        case .throughput:
            guard self.phase < self.phases.count else {
                self.mismatched += 1  // more frames than announced
                return
            }
            let k = self.taken
            if !frame.withUnsafeReadableBytes({ self.pattern.check(k, $0) }) {
                self.mismatched += 1
            }
            self.taken += 1
            if self.taken == self.phases[self.phase] {
                let ack = "ack \(self.taken) \(self.mismatched)"
                context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: ack)), promise: nil)
                self.phase += 1
                self.taken = 0
                self.mismatched = 0
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.flush()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

func serve() -> Never {
    Reference.catchStopSignals()
    let path = Reference.path(socketName)
    let corrupt = arguments.corrupt
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    let server: any Channel
    do {
        server = try ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try addFraming(channel.pipeline.syncOperations, EchoServerHandler(corrupt: corrupt))
                }
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true)
            .wait()
    } catch {
        Reference.exit(error, context: "cannot listen on \(path)")
    }
    Reference.ready()
    Reference.waitForStop()
    unlink(path)
    Reference.exitLater(milliseconds: 2000, status: 0)
    try? server.close().wait()
    try? group.syncShutdownGracefully()
    exit(0)
}

// MARK: - Client

/// What measure's command line asks a client connection for.
struct ClientRun {
    let pattern: Pattern
    let warmup: Int
    let count: Int
    /// measure --corrupt: the first timed one-way message is wrong.
    let corrupt: Bool
}

/// What the two client handlers share: the hello that opens the connection, and the failures that
/// end a measurement (a wrong answer, the server closing the connection, a connection error) by
/// failing its promise.
protocol ClientHandler: ChannelInboundHandler where InboundIn == ByteBuffer, OutboundOut == ByteBuffer {
    associatedtype Outcome: Sendable
    /// "latency" or "throughput", as the hello names it.
    static var mode: String { get }
    var run: ClientRun { get }
    /// Succeeds with the measurement, or fails with the one line to exit with.
    var done: EventLoopPromise<Outcome> { get }
}

extension ClientHandler {
    /// The connection's first frame: "hello <latency|throughput> <payload> <warmup> <count>".
    func channelActive(context: ChannelHandlerContext) {
        let hello = "hello \(Self.mode) \(self.run.pattern.payload) \(self.run.warmup) \(self.run.count)"
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: hello)), promise: nil)
    }

    func fail(_ context: ChannelHandlerContext, _ message: String) {
        self.done.fail(ReferenceFailure(message))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.done.fail(ReferenceFailure("the server closed the connection"))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.fail(context, "connection error: \(error)")
    }
}

/// Round trips one after another, driven from the event loop: each echo sends the next message.
final class LatencyClientHandler: ClientHandler {
    static let mode = "latency"
    let run: ClientRun
    let done: EventLoopPromise<[UInt64]>
    private let total: Int
    private var samples: [UInt64] = []
    private var k = 0
    private var start: UInt64 = 0
    private var awaitingOK = true

    init(_ run: ClientRun, done: EventLoopPromise<[UInt64]>) {
        self.run = run
        self.done = done
        self.total = run.warmup + run.count
        self.samples.reserveCapacity(run.count)
    }

    private func sendNext(context: ChannelHandlerContext) {
        if self.k == self.run.warmup { Reference.startAccounting() }
        self.start = Reference.now()
        var buffer = context.channel.allocator.buffer(capacity: self.run.pattern.payload)
        buffer.writeBytes(self.run.pattern.message(self.k))
        context.writeAndFlush(self.wrapOutboundOut(buffer), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let end = Reference.now()
        var frame = self.unwrapInboundIn(data)
        if self.awaitingOK {
            guard frame.readString(length: frame.readableBytes) == "ok" else {
                return self.fail(context, "unexpected answer to hello")
            }
            self.awaitingOK = false
            return self.sendNext(context: context)
        }
        let k = self.k
        guard frame.withUnsafeReadableBytes({ self.run.pattern.check(k, $0) }) else {
            let why = frame.withUnsafeReadableBytes { self.run.pattern.describeMismatch(k, $0) }
            return self.fail(context, "wrong echo: \(why)")
        }
        if k >= self.run.warmup { self.samples.append(Reference.sample(from: self.start, to: end)) }
        Reference.progress()
        self.k += 1
        if self.k == self.total {
            Reference.stopAccounting()
            self.done.succeed(self.samples)
        } else {
            self.sendNext(context: context)
        }
    }
}

/// N frames back to back, as fast as the channel's writability allows, then the server's
/// acknowledgement of the last one.
final class ThroughputClientHandler: ClientHandler {
    static let mode = "throughput"
    let run: ClientRun
    let done: EventLoopPromise<UInt64>
    private var phases: [(messages: Int, timed: Bool)]
    private var phase = 0
    private var sent = 0
    private var sending = false
    private var start: UInt64 = 0
    private var awaitingOK = true

    init(_ run: ClientRun, done: EventLoopPromise<UInt64>) {
        self.run = run
        self.done = done
        self.phases = (run.warmup > 0 ? [(run.warmup, false)] : []) + [(run.count, true)]
    }

    private func beginPhase(context: ChannelHandlerContext) {
        if self.phases[self.phase].timed {
            Reference.startAccounting()
            self.start = Reference.now()
        }
        self.sent = 0
        self.sending = true
        self.pump(context: context)
    }

    private func pump(context: ChannelHandlerContext) {
        let (messages, timed) = self.phases[self.phase]
        while self.sent < messages && context.channel.isWritable {
            var buffer = context.channel.allocator.buffer(capacity: max(self.run.pattern.payload, 1))
            if timed && self.sent == 0 && self.run.corrupt {
                buffer.writeBytes(Pattern.corrupted(self.run.pattern.message(0)))
            } else {
                buffer.writeBytes(self.run.pattern.message(self.sent))
            }
            context.write(self.wrapOutboundOut(buffer), promise: nil)
            self.sent += 1
        }
        if self.sent == messages { self.sending = false }
        context.flush()
        Reference.progress()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if self.sending && context.channel.isWritable { self.pump(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let end = Reference.now()
        var frame = self.unwrapInboundIn(data)
        let text = frame.readString(length: frame.readableBytes) ?? ""
        if self.awaitingOK {
            guard text == "ok" else { return self.fail(context, "unexpected answer to hello: '\(text)'") }
            self.awaitingOK = false
            return self.beginPhase(context: context)
        }
        let words = text.split(separator: " ")
        guard words.count == 3, words[0] == "ack", let taken = Int(words[1]), let bad = Int(words[2]) else {
            return self.fail(context, "unexpected acknowledgement '\(text)'")
        }
        let (messages, timed) = self.phases[self.phase]
        if bad != 0 { return self.fail(context, "the receiver found \(bad) of \(taken) messages wrong") }
        if taken != messages { return self.fail(context, "the receiver took \(taken) messages, expected \(messages)") }
        Reference.progress()
        if timed {
            Reference.stopAccounting()
            self.done.succeed(Reference.sample(from: self.start, to: end))
        } else {
            self.phase += 1
            self.beginPhase(context: context)
        }
    }
}

func measure() -> Never {
    Reference.startWatchdog()
    let path = Reference.path(socketName)
    Reference.requireSocket(path)
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    let loop = group.next()
    let run = ClientRun(
        pattern: Pattern(payload: arguments.payload),
        warmup: arguments.warmup,
        count: arguments.count,
        corrupt: arguments.corrupt
    )

    func connect(_ makeHandler: @escaping @Sendable () -> any ChannelHandler) -> any Channel {
        do {
            return try ClientBootstrap(group: loop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture { try addFraming(channel.pipeline.syncOperations, makeHandler()) }
                }
                .connect(unixDomainSocketPath: path)
                .wait()
        } catch {
            Reference.exit(error, context: "cannot connect to \(path)")
        }
    }

    /// Connects with the handler that makeHandler makes for the measurement's promise, and reports
    /// the outcome, or exits with its failure (a failure that is not a ReferenceFailure is named
    /// after the mode).
    func runClient<Outcome: Sendable>(
        _ mode: String,
        _ makeHandler: @escaping @Sendable (EventLoopPromise<Outcome>) -> any ChannelHandler,
        report: (Outcome) -> Void
    ) {
        let done = loop.makePromise(of: Outcome.self)
        let channel = connect { makeHandler(done) }
        do {
            report(try done.futureResult.wait())
        } catch {
            Reference.exit(error, context: mode)
        }
        try? channel.close().wait()
    }

    switch arguments.mode {
    case .latency:
        runClient(LatencyClientHandler.mode, { LatencyClientHandler(run, done: $0) }) {
            Reference.printLatency(samples: $0)
        }
    case .throughput:
        runClient(ThroughputClientHandler.mode, { ThroughputClientHandler(run, done: $0) }) {
            Reference.printThroughput(elapsedNs: $0)
        }
    }
    try? group.syncShutdownGracefully()
    exit(0)
}

switch arguments.command {
case .serve: serve()
case .measure: measure()
}
