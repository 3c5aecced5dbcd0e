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

/// Round trips one after another, driven from the event loop: each echo sends the next message.
final class LatencyClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let pattern: Pattern
    private let warmup: Int
    private let total: Int
    private let done: EventLoopPromise<[UInt64]>
    private var samples: [UInt64] = []
    private var k = 0
    private var start: UInt64 = 0
    private var awaitingOK = true

    init(pattern: Pattern, warmup: Int, count: Int, done: EventLoopPromise<[UInt64]>) {
        self.pattern = pattern
        self.warmup = warmup
        self.total = warmup + count
        self.done = done
        self.samples.reserveCapacity(count)
    }

    func channelActive(context: ChannelHandlerContext) {
        let hello = "hello latency \(self.pattern.payload) \(self.warmup) \(self.total - self.warmup)"
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: hello)), promise: nil)
    }

    private func sendNext(context: ChannelHandlerContext) {
        if self.k == self.warmup { Reference.startAccounting() }
        self.start = Reference.now()
        var buffer = context.channel.allocator.buffer(capacity: self.pattern.payload)
        buffer.writeBytes(self.pattern.message(self.k))
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
        guard frame.withUnsafeReadableBytes({ self.pattern.check(k, $0) }) else {
            let why = frame.withUnsafeReadableBytes { self.pattern.describeMismatch(k, $0) }
            return self.fail(context, "wrong echo: \(why)")
        }
        if k >= self.warmup { self.samples.append(Reference.sample(from: self.start, to: end)) }
        Reference.progress()
        self.k += 1
        if self.k == self.total {
            Reference.stopAccounting()
            self.done.succeed(self.samples)
        } else {
            self.sendNext(context: context)
        }
    }

    private func fail(_ context: ChannelHandlerContext, _ message: String) {
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

/// N frames back to back, as fast as the channel's writability allows, then the server's
/// acknowledgement of the last one.
final class ThroughputClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let pattern: Pattern
    private let warmup: Int
    private let count: Int
    private let corrupt: Bool
    private let done: EventLoopPromise<UInt64>
    private var phases: [(messages: Int, timed: Bool)]
    private var phase = 0
    private var sent = 0
    private var sending = false
    private var start: UInt64 = 0
    private var awaitingOK = true

    init(pattern: Pattern, warmup: Int, count: Int, corrupt: Bool, done: EventLoopPromise<UInt64>) {
        self.pattern = pattern
        self.warmup = warmup
        self.count = count
        self.corrupt = corrupt
        self.done = done
        self.phases = (warmup > 0 ? [(warmup, false)] : []) + [(count, true)]
    }

    func channelActive(context: ChannelHandlerContext) {
        let hello = "hello throughput \(self.pattern.payload) \(self.warmup) \(self.count)"
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: hello)), promise: nil)
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
            var buffer = context.channel.allocator.buffer(capacity: max(self.pattern.payload, 1))
            if timed && self.sent == 0 && self.corrupt {
                buffer.writeBytes(Pattern.corrupted(self.pattern.message(0)))
            } else {
                buffer.writeBytes(self.pattern.message(self.sent))
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

    private func fail(_ context: ChannelHandlerContext, _ message: String) {
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

func measure() -> Never {
    Reference.startWatchdog()
    let path = Reference.path(socketName)
    Reference.requireSocket(path)
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    let loop = group.next()
    let pattern = Pattern(payload: arguments.payload)
    let (warmup, count, corrupt) = (arguments.warmup, arguments.count, arguments.corrupt)

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

    switch arguments.mode {
    case .latency:
        let done = loop.makePromise(of: [UInt64].self)
        let channel = connect { LatencyClientHandler(pattern: pattern, warmup: warmup, count: count, done: done) }
        do {
            let samples = try done.futureResult.wait()
            Reference.printLatency(samples: samples)
        } catch {
            Reference.exit(error, context: "latency")
        }
        try? channel.close().wait()
    case .throughput:
        let done = loop.makePromise(of: UInt64.self)
        let channel = connect {
            ThroughputClientHandler(pattern: pattern, warmup: warmup, count: count, corrupt: corrupt, done: done)
        }
        do {
            let elapsed = try done.futureResult.wait()
            Reference.printThroughput(elapsedNs: elapsed)
        } catch {
            Reference.exit(error, context: "throughput")
        }
        try? channel.close().wait()
    }
    try? group.syncShutdownGracefully()
    exit(0)
}

switch arguments.command {
case .serve: serve()
case .measure: measure()
}
