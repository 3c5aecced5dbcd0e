import DequeModule
public import IPCCore
import Synchronization
import SystemPackage

/// A ``MessageConnection`` driven by the event loop over any ``EngineChannel``: the one
/// implementation of connection behaviour that every engine-based transport shares.
///
/// **Receiving** happens on the loop's thread when the channel's descriptor is readable: frames
/// are cut, replies complete their requests, requests go to the request handler (a task off the
/// loop, whose reply suspends rather than blocks while the peer is full), to the on-loop fast
/// path (whose reply is written from the loop) or to ``messages``, one-way messages to the message handler or to
/// ``messages``. When ``messages`` holds ``ConnectionOptions/messageBufferLimit``, the loop
/// stops watching this connection until the application takes one (the peer's sends then wait
/// and time out; nothing is dropped). A peer that stops inside a frame for
/// ``ConnectionOptions/stalledFrameTimeout`` is dropped with ``IPCError/Code/truncatedFrame``
/// (detected between one and two such periods after its last byte).
///
/// **Sending** writes on the caller's thread without blocking when the kernel takes the frame
/// at once (the usual case). Otherwise the frame waits in the connection's outbound queue,
/// behind any frame already there (frames never interleave), and:
/// - ``request(_:msgid:sendTimeout:receiveTimeout:)`` suspends until its frame is written
///   (cancelling the task takes out a frame not yet started);
/// - ``send(_:msgid:timeout:)``, the synchronous send, waits on the caller's thread — or, on the
///   loop's own thread (a handler, or a task that prefers the loop), returns at once and leaves
///   the loop to write the rest.
/// - the `async` ``send(_:msgid:timeout:)-async``, made on the loop's thread (a task that
///   prefers the loop), over a channel with a ``EngineChannel/heldWriteLimit``, holds a frame of
///   up to 65 KiB (a 64 KiB payload and its header) back and returns: the frames such sends
///   hold in one round of the loop go in one write at the end of that round, before the loop
///   next waits, or as soon as the next one would take them over their batch's limits
///   (docs/ENGINE.md, "Held writes"). A held frame is written before any frame sent after it,
///   and before the connection closes when this side invalidates it (what the kernel has room
///   for then; there is no lingering close); one the kernel has no room for waits in the queue
///   as a frame sent on the loop's thread does.
/// A frame not written by its timeout fails with ``IPCError/Code/sendTimeout`` if none of it
/// was written, and invalidates the connection if part of it was (the stream cannot carry
/// another frame after a torn one) or if nobody waits for it (a send from the loop's thread:
/// it would otherwise be dropped unseen).
///
/// **Replies without a hand-over**: a task that prefers ``eventLoop`` as its executor is resumed
/// on the loop's thread right after the loop reads its reply.
public final class EngineConnection: MessageConnection, @unchecked Sendable {
    // @unchecked: the reading state (`paused`, `bytesRead`, `stallTimerArmed`, `finished`) is
    // touched only on the loop's thread; everything else is immutable or behind `writeState`.

    public let peer: PeerCredentials?
    /// The loop this connection is served by: prefer it as a task executor for hop-free replies.
    public let eventLoop: EventLoop

    /// The channel, for its transport's own bookkeeping (a queue's name, for example).
    package let channel: any EngineChannel
    package let core: ConnectionCore
    /// The loop's registration of the channel's ``EngineChannel/descriptor``.
    private let token: UInt64
    /// The registration of its ``EngineChannel/writeDescriptor``, when that is another
    /// descriptor: watched for room only, while frames wait to be written.
    private let writeToken: UInt64?
    /// The loop reads ``EngineChannel/descriptor`` (``ChannelInbound/descriptor``); else the
    /// bytes are delivered or pulled (``readNow()``).
    private let readsDescriptor: Bool
    /// Reading can pause for the message buffer's bound: every channel but a
    /// ``ChannelInbound/delivered`` one, whose full buffer ends the connection instead.
    private let pausable: Bool
    /// The descriptor is not read but watched for the peer's end
    /// (``EngineChannel/watchesDescriptorForEnd``), edge-triggered.
    private let watchesEnd: Bool
    /// Waiting frames are tried again from a timer (``ChannelWriteWait/retried``).
    private let retriesWrites: Bool
    /// Senders on threads of their own leave their frames to the loop and wait for its word,
    /// rather than wait for room on the descriptor themselves: a doorbell announces room to the
    /// loop only, and a message queue cannot be woken by ``EngineChannel/shutdown()``.
    private let writesThroughLoop: Bool
    #if os(Linux)
    /// Watches the peer's process (``watchPeerProcess(_:)``), until the connection finishes.
    private let peerWatch = Mutex<ProcessWatcher.Watch?>(nil)
    #endif
    private let onInvalidated: (@Sendable (EngineConnection) -> Void)?
    /// How long a reply from a handler may wait to be written.
    private let replySendTimeout: Duration = .seconds(5)
    /// Outbound bytes the loop's own sends may leave queued before they fail at once.
    private let outboundLimit: Int
    /// The channel's descriptor is a doorbell (``ChannelReadiness/doorbell``): one edge per
    /// ring, meaning read and write alike.
    private let doorbell: Bool
    /// The channel writes several frames in one call (``EngineChannel/gathersWrites``).
    private let gathers: Bool
    /// The most bytes the `async` one-way sends made on the loop's thread hold back for one
    /// write at the end of the loop's round (``EngineChannel/heldWriteLimit``); 0: none.
    private let heldLimit: Int
    /// The rest of a large frame, sent or received, goes to the kernel whole, through the loop's
    /// transfer ring (``EngineChannel/kernelFinishesWrites`` and
    /// ``EventLoop/LargeTransfers/ioUring``), rather than in pieces as the poller reports room
    /// or bytes. Not for a spinning connection, whose loop polls its channel itself.
    private let kernelFinishes: Bool

    private struct WriteState {
        /// The descriptor is closed, or is closed as soon as the active writer stops.
        var closed = false
        /// A thread is writing to the descriptor now.
        var writerActive = false
        var queue = Deque<PendingWrite>()
        var queuedBytes = 0
        /// What the loop watches the descriptor for.
        var watchingReadable = true
        var watchingWritable = false
        /// The deadline of the earliest write-deadline timer armed and not yet fired, if any:
        /// one timer for the queue, not one per frame.
        var deadlineTimer: UInt64?
        /// For a channel whose writes are retried (``ChannelWriteWait/retried``): a retry timer
        /// is armed, and the delay it was armed with (0 after a flush that emptied the queue).
        var retryArmed = false
        var retryDelay: UInt64 = 0
        /// Frames are held back by sends on the loop's thread (``hold(_:timeout:)``), outside the
        /// queue: no other writer may begin, and the loop's flush waits, until they are written.
        var holding = false
        /// Invalidated off the loop's thread with nothing held: the descriptor was shut down,
        /// and a send from the loop must not hold a frame that could no longer be written.
        var shutDown = false
    }

    private let writeState = Mutex(WriteState())

    // Loop thread only, so their dynamic exclusivity checks (a runtime call per access) are
    // left out.
    @exclusivity(unchecked) private var paused = false
    @exclusivity(unchecked) private var finished = false
    private let readiness: ReadinessHandler
    @exclusivity(unchecked) private var bytesRead: UInt64 = 0
    @exclusivity(unchecked) private var stallTimerArmed = false
    /// The write of held frames is asked of the loop for the end of its round.
    @exclusivity(unchecked) private var heldWriteArmed = false
    /// The frames held back by sends on the loop's thread, in order, with their encoded lengths
    /// (``hold(_:timeout:)``): `heldBytes` in all, larger than ``heldLimit`` each or not
    /// (`heldLarge`), the first held when the clock read `heldSince` with `heldTimeout`; the
    /// batch is written by `heldDeadline` or the connection ends. Loop thread only.
    @exclusivity(unchecked) private var heldFrames: [Frame] = []
    @exclusivity(unchecked) private var heldTotals: [Int] = []
    @exclusivity(unchecked) private var heldBytes = 0
    @exclusivity(unchecked) private var heldLarge = false
    @exclusivity(unchecked) private var heldSince: UInt64 = 0
    @exclusivity(unchecked) private var heldTimeout: Duration = .zero
    @exclusivity(unchecked) private var heldDeadline: UInt64 = 0
    #if os(Linux)
    /// The transfer ring's slot of the rest of the queue's head, while the kernel finishes it
    /// (``finishInKernel(_:)``): the loop holds the right to write until its completion.
    @exclusivity(unchecked) private var kernelSlot: Int?
    /// The transfer ring's slot of the rest of the frame being read, while the kernel receives
    /// it (``readInKernel()``): nothing else reads the descriptor until its completion.
    @exclusivity(unchecked) private var kernelReadSlot: Int?
    /// The stall timer stopped the kernel's receive to see whether bytes came (``checkStall``):
    /// the bytes read when it was armed.
    @exclusivity(unchecked) private var kernelStallCheck: UInt64?
    #endif
    /// A frame was queued while frames were held (by another thread, or by another kind of send
    /// on this one): the batch takes no more, so that nothing sent after that frame goes before it.
    private let queuedBehindHeld = Atomic<Bool>(false)
    /// What a request delivered through ``messages`` replies with: weak, so that a request
    /// kept by the application does not keep the connection; made the first time one is.
    private lazy var responder: @Sendable (Frame) throws -> Void = { [weak self, replySendTimeout] frame in
        guard let self else { throw IPCError(code: .invalidated, message: "the connection is gone") }
        try self.sendFrame(frame, timeout: replySendTimeout)
    }
    /// What ``ConnectionOptions/requestHandler``'s tasks reply with: a send that suspends
    /// while the peer's buffer is full. Made once, the first time a request is served, and kept
    /// by the request server only: strong, it would keep this connection for good if the
    /// connection kept it too; the server lets go of it when the connection finishes.
    private func makeTaskResponder() -> RequestServer.ReplySender {
        { [self] frame in
            guard let rest = try startSending(frame) else { return nil }
            return { [self] in try await finishSending(rest, timeout: replySendTimeout) }
        }
    }

    /// Serves `channel` on `loop` (the process's shared loop by default) from now on.
    /// - Parameter label: names the connection in the loop's stall report (``EventLoop/stalls``),
    ///   for example with its transport and endpoint; the peer's pid is added.
    /// - Parameter onInvalidated: runs once, during invalidation, before the invalidation
    ///   handler (a listener's bookkeeping).
    /// - Throws: ``IPCError/Code/transportFailure`` if the loop cannot watch the descriptor;
    ///   the channel is then closed.
    public init(
        channel: any EngineChannel,
        peer: PeerCredentials?,
        options: ConnectionOptions,
        loop: EventLoop? = nil,
        label: String = "a connection",
        onInvalidated: (@Sendable (EngineConnection) -> Void)? = nil
    ) throws {
        let serving: EventLoop
        do {
            serving = try loop ?? EventLoop.shared()
        } catch {
            channel.close()
            throw error
        }
        self.channel = channel
        self.peer = peer
        self.eventLoop = serving
        self.core = ConnectionCore(options: options, loop: serving, loopExecutor: serving)
        self.onInvalidated = onInvalidated
        self.outboundLimit = options.messageBufferLimit.bytes
        self.doorbell = channel.readiness == .doorbell
        self.gathers = channel.gathersWrites
        self.heldLimit = channel.gathersWrites ? max(0, channel.heldWriteLimit) : 0
        #if os(Linux)
        self.kernelFinishes = channel.kernelFinishesWrites && serving.largeTransfers == .ioUring && !options.waitStrategy.spins
        #else
        self.kernelFinishes = false
        #endif
        let readsDescriptor = channel.inbound == .descriptor
        let separateWriter = channel.writeDescriptor != channel.descriptor
        self.readsDescriptor = readsDescriptor
        self.pausable = channel.inbound != .delivered
        let watchesEnd = !readsDescriptor && channel.watchesDescriptorForEnd
        self.watchesEnd = watchesEnd
        self.retriesWrites = channel.writeWait == .retried
        self.writesThroughLoop = doorbell || separateWriter || !readsDescriptor || retriesWrites
        // A spinning connection whose channel polls itself is polled by the spinning loop
        // (EngineChannel.pollWhileSpinning).
        let stallLabel = "the receive path of \(label)\(peer.map { " (peer pid \($0.pid))" } ?? "") and the on-loop handlers it ran"
        let handler = ReadinessHandler(
            polled: readsDescriptor && options.waitStrategy.spins && channel.startPollingWhileSpinning() ? channel : nil,
            stallLabel: stallLabel
        )
        self.readiness = handler
        let writeHandler = separateWriter ? ReadinessHandler(polled: nil, stallLabel: stallLabel) : nil
        // Registered watching nothing, and watched once the handler can reach this connection
        // (below): an event before that would find no connection, and an edge-triggered
        // descriptor (a doorbell, an end watch) reports its first edge only once.
        let interest: Poller.Interest = !readsDescriptor ? (watchesEnd ? [.readable, .edgeTriggered] : []) : doorbell ? [.readable, .edgeTriggered] : .readable
        do {
            token = try serving.register(channel.descriptor.rawValue, interest: [], waitStrategy: options.waitStrategy, handler: handler)
        } catch {
            channel.close()
            throw error
        }
        if let writeHandler {
            do {
                writeToken = try serving.register(channel.writeDescriptor.rawValue, interest: [], handler: writeHandler)
            } catch {
                serving.deregister(token)
                channel.close()
                throw error
            }
        } else {
            writeToken = nil
        }
        handler.connection = self
        writeHandler?.connection = self
        do {
            try serving.watch(token, interest)
        } catch {
            handler.connection = nil
            writeHandler?.connection = nil
            serving.deregister(token)
            if let writeToken { serving.deregister(writeToken) }
            channel.close()
            throw error
        }
    }

    /// Forwards readiness to the connection. The loop's table keeps the handler and the handler
    /// the connection, until invalidation deregisters it and lets go of the connection (which
    /// keeps the handler too): a connection lives while it is valid, whether or not its user
    /// keeps a reference (as a socket lives until it is closed). A weak
    /// reference would be cheaper to reason about and dearer to run: it gives the connection a
    /// side table, and every retain and release of it then takes the runtime's slow path.
    private final class ReadinessHandler: EventHandler, @unchecked Sendable {
        // @unchecked: set before the registration watches anything (``EventLoop/watch(_:_:)``
        // takes the loop's lock after), and cleared on the loop's thread, where it is used,
        // when the connection finishes.
        var connection: EngineConnection?
        /// The channel, when the spinning loop polls it. Held here, not reached through the
        /// connection: the connection has weak references, so each retain of it takes the
        /// runtime's slow path, and the loop asks many times a microsecond.
        let polled: (any EngineChannel)?
        /// Loop thread only: off while reading is paused for the message buffer's bound, and
        /// for good once the connection finished (its channel may be closed by then).
        var probing = true
        let stallLabel: String

        init(polled: (any EngineChannel)?, stallLabel: String) {
            self.polled = polled
            self.stallLabel = stallLabel
        }

        var pollsWhileSpinning: Bool { polled != nil }

        func handleEvent(readable: Bool, writable: Bool, hangUp: Bool) {
            connection?.handleEvent(readable: readable, writable: writable)
        }

        func pollWhileSpinning() -> Bool {
            probing && polled?.pollWhileSpinning() == true
        }

        func armBeforeSleep() -> Bool {
            probing && polled?.armBeforeSleep() == true
        }
    }

    // MARK: MessageConnection

    public var messages: AsyncStream<ReceivedMessage> { core.messages }

    public var invalidationReason: InvalidationReason? { core.latch.reason }

    public func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        core.latch.setHandler(handler)
    }

    public func invalidate() {
        invalidate(InvalidationReason(.invalidatedLocally))
    }

    /// Sends a one-way message; see the type's notes on sending.
    public func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws {
        try sendFrame(Frame(kind: .message, msgid: msgid, payload: payload), timeout: timeout)
    }

    /// Messages received and not yet taken from ``messages``.
    public var bufferedMessageCount: Int { core.bufferedMessageCount }

    // Inlined into its protocol witness, as `request` is: about 190 instructions fewer a message
    // of the one-way stream (Reports/inlined-entry-points).
    /// Sends a one-way message, suspending while the peer's buffer is full.
    /// On the loop's thread, over a channel with a ``EngineChannel/heldWriteLimit``, a frame of
    /// up to 65 KiB (a 64 KiB payload and its header) is held back for one write with the others
    /// of the loop's round, and this returns before it reaches the kernel (see the type's notes
    /// on sending).
    @inline(__always)
    public nonisolated(nonsending) func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        let frame = Frame(kind: .message, msgid: msgid, payload: payload)
        if heldLimit > 0, eventLoop.inEventLoop, try hold(frame, timeout: timeout) { return }
        // The common case writes at once, with no async call: each one costs the task two
        // executor checks (swift_task_switch) here.
        if let rest = try startSending(frame) {
            try await finishSending(rest, timeout: timeout)
        }
    }

    public var preferredTaskExecutor: (any TaskExecutor)? { eventLoop }

    /// Sends one-way messages in order, as many in one gathering write as the kernel takes
    /// (at most 64 or 256 KiB a write) while nothing else is queued, over a channel that
    /// ``EngineChannel/gathersWrites`` (a send each otherwise); see
    /// ``MessageConnection/send(contentsOf:msgid:timeout:)``. A message the kernel had no room
    /// for waits as ``send(_:msgid:timeout:)-async``'s does, then the rest go on.
    public nonisolated(nonsending) func send(contentsOf payloads: [[UInt8]], msgid: UInt32, timeout: Duration) async throws {
        var next = payloads.startIndex
        while next < payloads.endIndex {
            if gathers, payloads.endIndex - next > 1, let (sent, rest) = try startSendingGathered(payloads[next...], msgid: msgid) {
                next += sent
                if let rest {
                    try await finishSending(rest, timeout: timeout)
                    next += 1
                }
                continue
            }
            if let rest = try startSending(Frame(kind: .message, msgid: msgid, payload: payloads[next])) {
                try await finishSending(rest, timeout: timeout)
            }
            next += 1
        }
    }

    /// Writes as many of `payloads`' messages as the kernel takes now in one gathering write,
    /// if nobody else writes and nothing is queued (`nil` otherwise: nothing was written).
    /// Returns how many went whole, and the one the kernel stopped in (perhaps at its first
    /// byte), whose writer's right is kept for ``finishSending(_:timeout:)``; `nil` if all went.
    /// - Throws: what ``checkWritable(_:)`` throws for the first message (one after it that
    ///   would throw ends the batch before it), or what the write throws (nothing of it went).
    private func startSendingGathered(_ payloads: ArraySlice<[UInt8]>, msgid: UInt32) throws -> (sent: Int, rest: UnfinishedWrite?)? {
        // The right to write first: when another writer has it, or frames wait, nothing of
        // the batch is built (the caller then sends its next message alone, queued).
        guard try beginWriting() else { return nil }
        var frames: [Frame] = []
        var totals: [Int] = []
        var remaining: Int
        do {
            var bytes = 0
            frames.reserveCapacity(min(payloads.count, Self.gatherFrameLimit))
            totals.reserveCapacity(frames.capacity)
            for payload in payloads {
                let frame = Frame(kind: .message, msgid: msgid, payload: payload)
                let total: Int
                if frames.isEmpty {
                    total = try checkWritable(frame)
                } else {
                    guard frames.count < Self.gatherFrameLimit, let checked = try? checkWritable(frame), bytes + checked <= Self.gatherByteLimit else { break }
                    total = checked
                }
                frames.append(frame)
                totals.append(total)
                bytes += total
            }
            remaining = try frames.count == 1 ? writeNow(frames[0], from: 0) : writeNow(frames[...], from: 0)
        } catch {
            endWriting()
            throw error
        }
        for (index, total) in totals.enumerated() {
            guard remaining >= total else {
                return (index, UnfinishedWrite(frame: frames[index], total: total, written: remaining))
            }
            remaining -= total
        }
        endWriting()
        return (frames.count, nil)
    }


    // Inlined into the protocol witness `MessageConnection.request` calls through: one async
    // frame fewer a request (its allocation from the task, the call and the return), about 150
    // instructions a round trip in the client (callgrind, Reports/inlined-entry-points).
    @inline(__always)
    public nonisolated(nonsending) func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        let frame = try core.startRequest(payload, msgid: msgid)
        do {
            if let rest = try startSending(frame) { try await finishSending(rest, timeout: sendTimeout) }
        } catch {
            core.requests.cancel(frame.correlation)
            if let refusal = await refusal(after: error) { throw refusal }
            throw error
        }
        return try await core.reply(to: frame, receiveTimeout: receiveTimeout)
    }

    /// A request's write found the peer gone: if the peer was a listener that refused this
    /// connection, its refusal is in the socket before the end, and the loop reads it first
    /// (``failedWrite(_:torn:)``). Waits for the loop to have done so, and returns the refusal.
    private func refusal(after error: any Error) async -> IPCError? {
        guard readsDescriptor, (error as? IPCError)?.code == .peerInvalidated else { return nil }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            eventLoop.execute { continuation.resume() }
        }
        return core.latch.reason?.refusal
    }

    // MARK: Invalidation

    /// Starts invalidation with `reason`, if the connection is still valid. Finishes at once on
    /// the loop's thread, else soon after on it.
    package func invalidate(_ reason: InvalidationReason) {
        guard core.latch.invalidate(reason) else { return }
        if eventLoop.inEventLoop {
            finish(reason)
        } else {
            // Wake a writer waiting on its own thread; the loop does the rest. Not while frames
            // are held for the loop's write (no writer waits on its thread then): the loop writes
            // them before it closes.
            // Under the lock, so that it never meets a descriptor the loop closed meanwhile.
            writeState.withLock { state in
                guard !state.holding, !state.closed else { return }
                state.shutDown = true
                channel.shutdown()
            }
            eventLoop.execute { [self] in finish(reason) }
        }
    }

    /// Runs once, on the loop's thread: stops watching, closes (or leaves the closing to a
    /// writer still active), fails queued writes, then reports through the core.
    private func finish(_ reason: InvalidationReason) {
        guard !finished else { return }
        // Frames this side accepted and the kernel has not yet taken (held back for the round's
        // write, or queued by the loop's own sends): a local end writes what the kernel takes of
        // them now, before anything is stopped or closed.
        if (core.latch.reason ?? reason).kind == .invalidatedLocally {
            writeHeld()
            flush()
        }
        finished = true
        readiness.probing = false
        // The connection and its handler keep each other: this ends the cycle.
        readiness.connection = nil
        core.finish(reason) {
            eventLoop.deregister(token)
            if let writeToken { eventLoop.deregister(writeToken) }
            #if os(Linux)
            if let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
            #endif
            let final = core.latch.reason ?? reason
            channel.ending(final)
            #if os(Linux)
            // The rest of a frame in the kernel's hands is stopped (a send's completion closes);
            // a receive is woken by the end of the stream too, should the cancel not be made.
            if let kernelSlot { eventLoop.transferRing()?.cancel(kernelSlot) }
            if let kernelReadSlot {
                eventLoop.transferRing()?.cancel(kernelReadSlot)
                channel.shutdown()
            }
            #endif
            let failed: [PendingWrite] = writeState.withLock { state in
                state.closed = true
                // A writer still active waits on its own thread (an off-loop send): it is woken
                // and closes when it stops.
                if !state.writerActive { channel.close() } else { channel.shutdown() }
                defer { state.queue.removeAll(); state.queuedBytes = 0 }
                return Array(state.queue)
            }
            for write in failed {
                write.complete(.failure(IPCError(code: .peerInvalidated, message: "the connection became invalid before the frame was written: \(final)")))
            }
            onInvalidated?(self)
        }
    }

    #if os(Linux)
    /// Ends the connection with ``InvalidationReason/Kind/peerDied`` when process `pid` exits:
    /// for a channel whose mechanism does not break when its peer dies (a message queue, a
    /// shared file). The watch ends when the connection does.
    /// - Throws: ``IPCError/Code/transportFailure`` if the process cannot be watched.
    package func watchPeerProcess(_ pid: Int32) throws {
        // Strong: the watch is cancelled when the connection finishes, which lets go of it (as
        // the loop's registration does).
        let watch = try ProcessWatcher.shared.watch(pid: pid) { [self] in
            invalidate(InvalidationReason(.peerDied, error: IPCError(code: .peerInvalidated, message: "process \(pid) exited")))
        }
        peerWatch.withLock { $0 = watch }
        // Ended before the watch was stored: `finish` found nothing to cancel, so cancel it
        // here, or the watch would keep this connection until the peer exits.
        if !core.latch.isValid, let watch = peerWatch.withLock({ $0.take() }) { ProcessWatcher.shared.cancel(watch) }
    }
    #endif

    // MARK: Reading (loop thread)

    /// Reads what was handed to a ``ChannelInbound/delivered`` channel, or what a
    /// ``ChannelInbound/pulled`` channel says is there, as the loop reads a descriptor: called
    /// on the loop's thread (by the reader that delivered it, right after; by whatever told a
    /// pulled channel). Does nothing while reading is paused: a pulled channel is read again
    /// when the application makes room.
    package func readNow() {
        if !paused, !finished { readSome() }
    }

    private func handleEvent(readable: Bool, writable: Bool) {
        // A doorbell's ring may mean room for what waits to be written as well as bytes to read.
        if writable || (doorbell && readable) { flush() }
        if readable, watchesEnd, !finished { channel.descriptorReported() }
        if readable, !paused, !finished { readSome() }
    }

    /// One read per readiness report: the loop is level-triggered, so what is left is reported
    /// again on its next round, after the other connections had their turn. (Reading until the
    /// kernel says it has nothing would cost a system call more per message.)
    private func readSome() {
        #if os(Linux)
        // The kernel is receiving the rest of a frame: the bytes are its until it completes.
        if kernelReadSlot != nil { return }
        #endif
        let count: Int?
        do {
            count = try channel.readAvailable()
        } catch let error as IPCError where error.code != .transportFailure {
            invalidate(InvalidationReason(.protocolError, error: error))
            return
        } catch {
            invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
            return
        }
        guard let count else { return }
        if count == 0 {
            endOfStream()
            return
        }
        bytesRead &+= UInt64(count)
        guard dispatchFrames() else { return }
        if channel.hasPartialFrame { partialFrameRead() }
    }

    /// Part of a frame is read and not the rest: the rest of a large one goes to the kernel to
    /// receive, else the stall timer watches for the rest.
    private func partialFrameRead() {
        #if os(Linux)
        if kernelFinishes { _ = readInKernel() }
        #endif
        armStallTimer()
    }

    /// The end of the stream was read.
    private func endOfStream() {
        // Whole frames read before the end still count.
        guard dispatchFrames() else { return }
        do {
            try channel.finishReading()
            invalidate(InvalidationReason(.peerClosed))
        } catch let error as IPCError where error.code == .peerInvalidated {
            // The channel knows the peer went without a goodbye.
            invalidate(InvalidationReason(.peerDied, error: error))
        } catch {
            invalidate(InvalidationReason(.protocolError, error: error as? IPCError))
        }
    }

    /// Dispatches the whole frames read so far. Returns `false` if reading must stop: the
    /// connection ended, or ``messages``' buffer is full (reading is then paused).
    private func dispatchFrames() -> Bool {
        do {
            if core.lendsMessages {
                // One-way messages are offered in place first; a frame not taken is dispatched as usual.
                while let next = try channel.nextFrame(lending: { header, payload in
                    core.lend(header, payload, replyNow: { try sendFrame($0, timeout: replySendTimeout) })
                }) {
                    var full = false
                    if case .owned(let frame) = next {
                        full = core.dispatch(
                            frame, replyNow: { try sendFrame($0, timeout: replySendTimeout) }, responder: { responder }, offered: true,
                            taskResponder: { self.makeTaskResponder() }
                        )
                    }
                    if finished || !core.latch.isValid { return endedByFrame() }
                    if full {
                        pauseReading()
                        return false
                    }
                }
                return true
            }
            while let frame = try channel.nextFrame() {
                let full = core.dispatch(
                    frame, replyNow: { try sendFrame($0, timeout: replySendTimeout) }, responder: { responder },
                    taskResponder: { self.makeTaskResponder() }
                )
                if finished || !core.latch.isValid { return endedByFrame() }
                if full {
                    pauseReading()
                    return false
                }
            }
            return true
        } catch {
            invalidate(InvalidationReason(.protocolError, error: error as? IPCError))
            return false
        }
    }

    /// A frame ended the connection (a listener's refusal, see ``ConnectionCore``): finishes
    /// it now, on the loop, with the latch's reason. Returns `false` (reading stops).
    private func endedByFrame() -> Bool {
        if !finished, let reason = core.latch.reason { finish(reason) }
        return false
    }

    private func pauseReading() {
        guard pausable else {
            // A shared reader cannot wait for this connection's application.
            invalidate(InvalidationReason(.transportFailure, error: .receiveBufferFull))
            return
        }
        paused = true
        readiness.probing = false
        // A pulled channel's end watch stays: the channel remembers what it reports.
        if readsDescriptor { updateInterest { $0.watchingReadable = false } }
        core.whenMessagesHaveRoom { [weak self] in
            guard let self else { return }
            eventLoop.execute { self.resumeReading() }
        }
    }

    private func resumeReading() {
        guard paused, !finished else { return }
        paused = false
        readiness.probing = true
        // Frames already read first; they may fill the buffer again.
        guard dispatchFrames() else { return }
        if readsDescriptor {
            updateInterest { $0.watchingReadable = true }
        } else {
            // Nothing will report what a pulled channel kept while paused: read it now.
            readSome()
        }
    }

    private func armStallTimer() {
        guard !stallTimerArmed, let stall = core.options.stalledFrameTimeout else { return }
        stallTimerArmed = true
        let seen = bytesRead
        eventLoop.schedule(at: monotonicNanoseconds() &+ stall.wholeNanoseconds) { [weak self] in
            self?.checkStall(seen: seen, stall: stall)
        }
    }

    private func checkStall(seen: UInt64, stall: Duration) {
        stallTimerArmed = false
        guard !finished, !paused, channel.hasPartialFrame else { return }
        #if os(Linux)
        if let kernelReadSlot {
            // What the kernel's receive has taken so far is not known until it ends: it is
            // stopped, and its end (with the bytes that came, if any) settles the check.
            kernelStallCheck = seen
            if eventLoop.transferRing()?.cancel(kernelReadSlot) != true {
                // Not stopped (the kernel refused the request): look again a period later.
                kernelStallCheck = nil
                armStallTimer()
            }
            return
        }
        #endif
        if bytesRead == seen {
            invalidate(InvalidationReason(.protocolError, error: IPCError(
                code: .truncatedFrame, message: "the peer sent part of a frame and then nothing for \(stall)"
            )))
        } else {
            armStallTimer()
        }
    }

    // MARK: Writing

    /// One frame waiting in the outbound queue. Its fields are guarded by `writeState`'s lock.
    private final class PendingWrite: @unchecked Sendable {
        // @unchecked: mutated only under the connection's `writeState` lock.
        let frame: Frame
        let total: Int
        var written: Int
        let deadline: UInt64
        var completion: Completion
        var done = false
        /// The loop is writing it now, with the lock released: a cancellation meanwhile is
        /// recorded (`cancelRequested`) and settled by the loop once the write returns.
        var inFlight = false
        var cancelRequested = false

        enum Completion {
            /// Nobody waits (a send from the loop's thread). If such a frame cannot be written
            /// by its deadline, nobody can be told, so the connection ends instead of dropping it.
            case none
            case task(CheckedContinuation<Void, any Error>)
            case thread(ConditionLock)
        }

        init(frame: Frame, total: Int, written: Int, deadline: UInt64, completion: Completion) {
            self.frame = frame
            self.total = total
            self.written = written
            self.deadline = deadline
            self.completion = completion
        }

        /// Reports the outcome once. Called with the connection's lock released.
        func complete(_ result: Result<Void, any Error>) {
            switch completion {
            case .none: break
            case .task(let continuation): continuation.resume(with: result)
            case .thread(let lock):
                lock.withLock {
                    outcome = result
                    lock.signal()
                }
            }
            completion = .none
        }

        var outcome: Result<Void, any Error>?

        /// Whether a sender waits to be told how it went (not a send from the loop's thread).
        var hasWaiter: Bool {
            if case .none = completion { return false }
            return true
        }
    }

    private func checkWritable(_ frame: Frame) throws -> Int {
        try core.checkValid()
        guard frame.payload.count <= core.options.maximumPayloadLength else {
            throw IPCError(code: .payloadTooLarge, message: "payload of \(frame.payload.count) bytes is above the maximum of \(core.options.maximumPayloadLength)")
        }
        return try channel.encodedLength(of: frame)
    }

    /// Takes the right to write if nobody has it and nothing is queued.
    private func beginWriting() throws -> Bool {
        try writeState.withLock { state in
            if state.closed { throw IPCError(code: .invalidated, message: "the connection is closed") }
            guard state.queue.isEmpty, !state.writerActive, !state.holding else { return false }
            state.writerActive = true
            return true
        }
    }

    /// Gives the right to write back; the loop flushes what was queued meanwhile.
    private func endWriting() {
        let (close, flushSoon): (Bool, Bool) = writeState.withLock { state in
            state.writerActive = false
            if state.closed { return (true, false) }
            // The rest of a large frame goes to the kernel at once, without waiting for room.
            if startsInKernel(state) { return (false, true) }
            if !state.queue.isEmpty, !state.watchingWritable {
                state.watchingWritable = true
                applyInterest(state)
            }
            // A doorbell rings for room only when a write found none: a frame queued behind
            // this writer for another reason needs the loop to look now.
            return (false, doorbell && !state.queue.isEmpty)
        }
        if close { channel.close() }
        if flushSoon { eventLoop.execute { [self] in flush() } }
        if retriesWrites { armWriteRetry() }
    }

    /// Frames above ``heldLimit`` are held too, up to this size (a 64 KiB payload with a header
    /// of up to 1 KiB), in batches of at most ``heldLargeFrameLimit`` frames and
    /// ``heldLargeByteLimit`` bytes (three 64 KiB frames): a gathering write of eight 4 KiB frames
    /// cost the sender's kernel 6.8 µs on this repository's VM, one of a single frame 1.9 µs
    /// (Benchmarks/SendSegments), and holding 64 KiB frames three to a batch made their stream
    /// about 9 % faster (Reports/large-streams); 1 MiB frames gained nothing, so they are not
    /// held, and a batch accepts at most 256 KiB beyond what the kernel took (docs/ENGINE.md,
    /// "Held writes").
    static let heldLargeFrameBytes = 65 * 1024
    static let heldLargeFrameLimit = 8
    static let heldLargeByteLimit = 256 * 1024

    /// Holds `frame` back for one write with the others held in this round of the loop (loop
    /// thread; see the type's notes on sending): when nobody else writes and nothing is queued,
    /// and it is within ``heldLimit`` (a batch of small frames, at most that many bytes together)
    /// or ``heldLargeFrameBytes`` (a batch of larger ones). Writes the held frames first when
    /// this one would take them over their batch's limits, is of the other kind, or a frame was
    /// queued behind them. Returns `false` if the frame must be sent the usual way instead (it
    /// then waits its turn behind what is queued).
    /// - Throws: what ``checkWritable(_:)`` throws, or ``IPCError/Code/invalidated`` once the
    ///   connection is closed or shut down.
    private func hold(_ frame: Frame, timeout: Duration) throws -> Bool {
        let total = try checkWritable(frame)
        let large = total > heldLimit
        guard !large || total <= Self.heldLargeFrameBytes else { return false }
        if !heldFrames.isEmpty {
            let full = large ? heldFrames.count == Self.heldLargeFrameLimit || heldBytes + total > Self.heldLargeByteLimit : heldBytes + total > heldLimit
            if heldLarge == large, !full, !queuedBehindHeld.load(ordering: .acquiring) {
                heldFrames.append(frame)
                heldTotals.append(total)
                heldBytes += total
                // The batch's deadline is its earliest frame's.
                if timeout != heldTimeout { heldDeadline = min(heldDeadline, heldSince &+ timeout.wholeNanoseconds) }
                return true
            }
            writeHeld()
        }
        // A batch begins only when nobody writes and nothing waits to be written.
        let begun: Bool = try writeState.withLock { state in
            if state.closed || state.shutDown { throw IPCError(code: .invalidated, message: "the connection is closed") }
            guard !state.writerActive, state.queue.isEmpty else { return false }
            state.holding = true
            return true
        }
        guard begun else { return false }
        heldSince = monotonicNanoseconds()
        heldTimeout = timeout
        heldDeadline = heldSince &+ timeout.wholeNanoseconds
        heldLarge = large
        heldFrames.append(frame)
        heldTotals.append(total)
        heldBytes = total
        if !heldWriteArmed {
            heldWriteArmed = true
            eventLoop.beforeWaiting { [self] in
                heldWriteArmed = false
                writeHeld()
            }
        }
        return true
    }

    /// Writes the held frames (loop thread), then what was queued behind them. While frames are
    /// held no other writer begins, so the descriptor is this call's. What the kernel had no
    /// room for goes to the front of the queue, in order, as frames nobody waits for: the loop
    /// writes them as room appears, and the queue's timer ends the connection if one is still
    /// unwritten at the batch's deadline. A write that fails has invalidated the connection
    /// (``writeNow(_:from:)``); the frames end with it.
    private func writeHeld() {
        guard !heldFrames.isEmpty else { return }
        var written = 0
        var failed = false
        if !finished {
            do {
                written = heldFrames.count == 1 ? try writeNow(heldFrames[0], from: 0) : try writeNow(heldFrames[...], from: 0)
            } catch {
                failed = true
                // Their senders were told they were sent: the connection must not go on without
                // them (a closed peer's end is reported by writeNow, after what it wrote is read).
                if (error as? IPCError)?.code != .peerInvalidated, core.latch.isValid {
                    invalidate(InvalidationReason(.transportFailure, error: error as? IPCError ?? IPCError(code: .transportFailure, message: "writing held frames failed: \(error)")))
                }
            }
        }
        var rest: [PendingWrite] = []
        if !failed, !finished, written < heldBytes {
            var skipped = 0
            for (frame, total) in zip(heldFrames, heldTotals) {
                let taken = min(max(written - skipped, 0), total)
                skipped += total
                if taken < total {
                    rest.append(PendingWrite(frame: frame, total: total, written: taken, deadline: heldDeadline, completion: .none))
                }
            }
        }
        let remaining = written < heldBytes ? heldBytes - written : 0
        let deadline = heldDeadline
        heldFrames.removeAll(keepingCapacity: true)
        heldTotals.removeAll(keepingCapacity: true)
        heldBytes = 0
        let (flushQueue, armTimer): (Bool, Bool) = writeState.withLock { state in
            state.holding = false
            queuedBehindHeld.store(false, ordering: .relaxed)
            guard !state.closed else { return (false, false) }
            if !rest.isEmpty {
                state.queue.insert(contentsOf: rest, at: 0)
                state.queuedBytes += remaining
                let arm = state.deadlineTimer.map { deadline < $0 } ?? true
                if arm { state.deadlineTimer = deadline }
                if !state.watchingWritable {
                    state.watchingWritable = true
                    applyInterest(state)
                }
                return (false, arm)
            }
            return (!state.queue.isEmpty, false)
        }
        if armTimer { armDeadlineTimer(deadline) }
        if !rest.isEmpty, retriesWrites { armWriteRetry() }
        if flushQueue { flush() }
    }

    /// Writes what the kernel takes now. Errors invalidate the connection when they must.
    private func writeNow(_ frame: Frame, from offset: Int) throws -> Int {
        do {
            return try channel.write(frame, from: offset)
        } catch let error as IPCError {
            failedWrite(error, torn: offset > 0)
            throw error
        }
    }

    /// Writes what the kernel takes now of several frames, one gathering write.
    private func writeNow(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int {
        do {
            return try channel.write(frames, from: offset)
        } catch let error as IPCError {
            failedWrite(error, torn: offset > 0)
            throw error
        }
    }

    private func failedWrite(_ error: IPCError, torn: Bool) {
        switch error.code {
        case .peerInvalidated:
            let reason = InvalidationReason(.peerClosed, error: error)
            guard readsDescriptor else {
                invalidate(reason)
                return
            }
            // What the peer wrote before it went is read first: its last frames, or a
            // listener's refusal, which then ends the connection with its own reason.
            eventLoop.execute { [self] in
                if !finished, !paused { readSome() }
                invalidate(reason)
            }
        case .malformedFrame, .truncatedFrame, .frameTooLarge:
            // What the peer shares with us (a ring's indexes) is broken: nothing more can go.
            invalidate(InvalidationReason(.protocolError, error: error))
        default:
            if error.code == .transportFailure || torn {
                invalidate(InvalidationReason(.transportFailure, error: error))
            }
        }
    }

    /// Takes the right to write if nobody has it and nothing is queued, and writes what the
    /// kernel takes now. Returns `nil` if the frame must queue behind another writer, else the
    /// bytes written; the right is given back when that is the whole frame, kept otherwise.
    private func writeAtOnce(_ frame: Frame, total: Int) throws -> Int? {
        guard try beginWriting() else { return nil }
        let written: Int
        do { written = try writeNow(frame, from: 0) } catch {
            endWriting()
            throw error
        }
        if written == total { endWriting() }
        return written
    }

    /// The synchronous send behind ``send(_:msgid:timeout:)`` and handler replies.
    package func sendFrame(_ frame: Frame, timeout: Duration) throws {
        let total = try checkWritable(frame)
        let onLoop = eventLoop.inEventLoop
        if var written = try writeAtOnce(frame, total: total) {
            if written == total { return }
            // The deadline is read only now: most frames never need one.
            let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
            if onLoop {
                enqueue(PendingWrite(frame: frame, total: total, written: written, deadline: deadline, completion: .none), first: true)
                endWriting()
                return
            }
            if writesThroughLoop {
                // Room is announced to the loop only: it writes the rest while we wait for its word.
                let lock = ConditionLock()
                let write = PendingWrite(frame: frame, total: total, written: written, deadline: deadline, completion: .thread(lock))
                enqueue(write, first: true)
                endWriting()
                return try awaitOutcome(of: write, lock, deadline: deadline)
            }
            // On a thread of the caller's own: keep the right to write and wait here for room.
            defer { endWriting() }
            while written < total {
                guard waitUntilWritable(channel.writeDescriptor.rawValue, deadline: deadline) else {
                    let error = IPCError(code: .sendTimeout, message: "the peer's receive buffer stayed full; \(written) of \(total) bytes sent before the send timeout")
                    if written > 0 { failedWrite(error, torn: true) }
                    throw error
                }
                written += try writeNow(frame, from: written)
            }
            return
        }
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        if onLoop {
            let over = writeState.withLock { $0.queuedBytes + total > outboundLimit && !$0.queue.isEmpty }
            if over {
                throw IPCError(code: .sendTimeout, message: "\(outboundLimit) bytes already wait to be written to a peer that does not read")
            }
            enqueue(PendingWrite(frame: frame, total: total, written: 0, deadline: deadline, completion: .none), first: false)
            return
        }
        let lock = ConditionLock()
        let write = PendingWrite(frame: frame, total: total, written: 0, deadline: deadline, completion: .thread(lock))
        enqueue(write, first: false)
        try awaitOutcome(of: write, lock, deadline: deadline)
    }

    /// Waits on the caller's thread for the loop to write a queued frame, or to fail it.
    private func awaitOutcome(of write: PendingWrite, _ lock: ConditionLock, deadline: UInt64) throws {
        let outcome: Result<Void, any Error>? = lock.withLock {
            while write.outcome == nil, lock.wait(until: deadline) {}
            return write.outcome
        }
        if let outcome { return try outcome.get() }
        // The deadline passed: the loop's timer settles it; wait for its word.
        try lock.withLock {
            while write.outcome == nil { lock.wait() }
            return write.outcome!
        }.get()
    }

    /// A frame ``startSending(_:)`` could not write whole at once: `written` bytes of it went
    /// (`nil`: none, and the connection's writer is not held).
    private struct UnfinishedWrite {
        let frame: Frame
        let total: Int
        let written: Int?
    }

    /// Writes `frame` whole now if it can; otherwise returns what ``finishSending(_:timeout:)``
    /// must finish.
    @inline(__always)
    private func startSending(_ frame: Frame) throws -> UnfinishedWrite? {
        let total = try checkWritable(frame)
        let first = try writeAtOnce(frame, total: total)
        return first == total ? nil : UnfinishedWrite(frame: frame, total: total, written: first)
    }

    /// Finishes a frame ``startSending(_:)`` began, suspending until the loop has written it:
    /// the suspending part of ``request(_:msgid:sendTimeout:receiveTimeout:)`` and of the
    /// `async` ``send(_:msgid:timeout:)``.
    private func finishSending(_ rest: UnfinishedWrite, timeout: Duration) async throws {
        let (frame, total) = (rest.frame, rest.total)
        let deadline = monotonicNanoseconds() &+ timeout.wholeNanoseconds
        let writing = rest.written != nil
        let written = rest.written ?? 0
        // The loop writes the rest (or all of it, behind what is queued); wait without a thread.
        let holder = Mutex<PendingWrite?>(nil)
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let write = PendingWrite(frame: frame, total: total, written: written, deadline: deadline, completion: .task(continuation))
                holder.withLock { $0 = write }
                enqueue(write, first: writing)
                if writing { endWriting() }
                if Task.isCancelled { cancel(write) }
            }
        } onCancel: {
            if let write = holder.withLock({ $0 }) { cancel(write) }
        }
    }

    /// Queues `write` (at the front for the rest of a frame already begun) and makes sure the
    /// loop watches for room; its deadline is checked by the queue's loop timer.
    private func enqueue(_ write: PendingWrite, first: Bool) {
        let (closed, flushSoon, armTimer): (Bool, Bool, Bool) = writeState.withLock { state in
            if state.closed { return (true, false, false) }
            if first { state.queue.prepend(write) } else { state.queue.append(write) }
            state.queuedBytes += write.total - write.written
            let arm = state.deadlineTimer.map { write.deadline < $0 } ?? true
            if arm { state.deadlineTimer = write.deadline }
            // Behind held frames, the loop's write of them takes it too, and they take no more.
            if state.holding { queuedBehindHeld.store(true, ordering: .releasing) }
            if !state.writerActive, !state.watchingWritable, !state.holding {
                if startsInKernel(state) { return (false, true, arm) }
                state.watchingWritable = true
                applyInterest(state)
                return (false, doorbell, arm)
            }
            return (false, false, arm)
        }
        if closed {
            write.complete(.failure(IPCError(code: .invalidated, message: "the connection is closed")))
            return
        }
        if flushSoon { eventLoop.execute { [self] in flush() } }
        if armTimer { armDeadlineTimer(write.deadline) }
        if retriesWrites { armWriteRetry() }
    }

    /// For a channel whose writes are retried (``ChannelWriteWait/retried``): unless one is
    /// armed already, or nothing waits, or a writer is active (it arms one when it stops), arms
    /// the timer that tries the queue again, 10 µs after the last try that found no room,
    /// doubling to 1 ms.
    private func armWriteRetry() {
        let delay: UInt64? = writeState.withLock { state in
            guard !state.closed, !state.retryArmed, !state.writerActive, !state.queue.isEmpty else { return nil }
            state.retryArmed = true
            state.retryDelay = state.retryDelay == 0 ? 10_000 : min(state.retryDelay * 2, 1_000_000)
            return state.retryDelay
        }
        guard let delay else { return }
        // Strong, for at most a millisecond: a retry after the end finds the queue closed.
        eventLoop.schedule(at: monotonicNanoseconds() &+ delay) { [self] in
            writeState.withLock { $0.retryArmed = false }
            flush()
        }
    }

    /// One timer for the outbound queue, at its earliest deadline; a timer that finds nothing
    /// due re-arms for what is left.
    private func armDeadlineTimer(_ deadline: UInt64) {
        eventLoop.schedule(at: deadline) { [weak self] in self?.expireDue(armed: deadline) }
    }

    /// The queue's timer fired: each queued write whose deadline passed fails with
    /// ``IPCError/Code/sendTimeout`` if none of it was written and someone waits for it; a
    /// frame begun (a torn frame) or one nobody waits for (``PendingWrite/Completion/none``:
    /// it would otherwise be dropped unseen) ends the connection.
    private func expireDue(armed: UInt64) {
        let now = monotonicNanoseconds()
        #if os(Linux)
        let kernelWriting = kernelSlot != nil
        #else
        let kernelWriting = false
        #endif
        let (failed, ending, rearm): ([PendingWrite], PendingWrite?, UInt64?) = writeState.withLock { state in
            if state.deadlineTimer == armed { state.deadlineTimer = nil }
            var failed: [PendingWrite] = []
            var ending: PendingWrite?
            var next: UInt64?
            for write in state.queue where !write.done {
                guard write.deadline <= now else {
                    next = min(next ?? write.deadline, write.deadline)
                    continue
                }
                // One in flight may be partly in the kernel (the send ring's): it is begun.
                if write.written == 0, write.hasWaiter, !write.inFlight {
                    write.done = true
                    state.queuedBytes -= write.total
                    failed.append(write)
                } else {
                    ending = ending ?? write
                }
            }
            // A torn frame's sender is told it timed out (the connection ends with it); one
            // that nobody waits for ends the connection unseen otherwise. A frame whose rest is
            // in the kernel's hands (in flight on the transfer ring, which the end cancels) is
            // told so too.
            if let ending, ending.hasWaiter, !ending.inFlight || kernelWriting {
                ending.done = true
                state.queuedBytes -= ending.total - ending.written
            }
            if !failed.isEmpty || ending?.done == true { state.queue.removeAll { $0.done } }
            guard ending == nil, let next, state.deadlineTimer.map({ next < $0 }) ?? true else { return (failed, ending, nil) }
            state.deadlineTimer = next
            return (failed, ending, next)
        }
        for write in failed {
            write.complete(.failure(IPCError(code: .sendTimeout, message: "the peer's receive buffer stayed full; none of the frame's \(write.total) bytes sent before the send timeout")))
        }
        if let ending {
            let error = IPCError(code: .sendTimeout, message: ending.written > 0
                ? "the peer's receive buffer stayed full; \(ending.written) of \(ending.total) bytes sent before the send timeout"
                : "the peer's receive buffer stayed full; a queued frame of \(ending.total) bytes, whose sender was not waiting, was not written before its send timeout")
            if ending.done { ending.complete(.failure(error)) }
            invalidate(InvalidationReason(.transportFailure, error: error))
        }
        if let rearm { armDeadlineTimer(rearm) }
    }

    /// A task waiting for its frame to be written was cancelled: take the frame out if none of
    /// it is written yet (a frame begun must be finished, or the stream is torn).
    private func cancel(_ write: PendingWrite) {
        let removed: Bool = writeState.withLock { state in
            if write.inFlight {
                write.cancelRequested = true
                return false
            }
            guard !write.done, write.written == 0, let index = state.queue.firstIndex(where: { $0 === write }) else { return false }
            state.queue.remove(at: index)
            state.queuedBytes -= write.total
            write.done = true
            return true
        }
        if removed { write.complete(.failure(CancellationError())) }
    }

    /// Writes queued frames while the kernel takes them (loop thread, on a writable event).
    private func flush() {
        let mayWrite: Bool = writeState.withLock { state in
            // Frames held by the loop's sends go first: their write flushes the queue after them.
            guard !state.closed, !state.writerActive, !state.holding else { return false }
            // A doorbell's ring comes with every message: most find nothing queued.
            guard !state.queue.isEmpty else {
                if state.watchingWritable {
                    state.watchingWritable = false
                    applyInterest(state)
                }
                return false
            }
            state.writerActive = true
            return true
        }
        guard mayWrite else { return }
        writeWhileTaken()
    }

    /// ``flush()``'s writing, with the right to write held: until the queue is empty, the kernel
    /// has no room, or the rest of the head went to the kernel to finish (its completion goes on
    /// from here, ``kernelWriteEnded(_:result:)``).
    private func writeWhileTaken() {
        while true {
            let progress = writeQueued()
            if progress == .inKernel { return }
            let wroteAll = progress == .empty
            let (close, again): (Bool, Bool) = writeState.withLock { state in
                if state.closed {
                    state.writerActive = false
                    return (true, false)
                }
                if state.queue.isEmpty {
                    state.writerActive = false
                    state.retryDelay = 0
                    if state.watchingWritable {
                        state.watchingWritable = false
                        applyInterest(state)
                    }
                    return (false, false)
                }
                // A frame another thread queued after the last look (it saw the writer active,
                // so it neither flushed nor watched): written now, keeping the right to write, as
                // nothing else would report it (a doorbell rings only for room a write lacked).
                if wroteAll { return (false, true) }
                state.writerActive = false
                if !state.watchingWritable {
                    state.watchingWritable = true
                    applyInterest(state)
                }
                return (false, false)
            }
            if again { continue }
            if close { channel.close() }
            if retriesWrites { armWriteRetry() }
            return
        }
    }

    /// The most frames, and bytes, one gathering write takes (``EngineChannel/write(_:from:)``
    /// with several frames); a first frame above the bytes' bound goes alone.
    static let gatherFrameLimit = 64
    static let gatherByteLimit = 256 * 1024

    private enum QueueProgress {
        /// The queue is empty.
        case empty
        /// Stopped at a frame the kernel had no room for (or a write failed, or a frame was
        /// cancelled).
        case blocked
        /// The rest of the head went to the kernel to finish (the send ring).
        case inKernel
    }

    /// Writes the queue's frames in order while the kernel takes them, holding the right to
    /// write (loop thread): several waiting frames in one gathering write, the first from the
    /// byte where it stopped.
    private func writeQueued() -> QueueProgress {
        while true {
            // The frames to write now, marked in flight: a cancellation meanwhile is recorded and
            // settled below. In flight, they stay in the queue, in order, at its front. The
            // frames after the head only when there are any (most drains find one frame).
            guard let (head, rest) = writeState.withLock({ state -> (PendingWrite, [PendingWrite]?)? in
                guard let head = state.queue.first else { return nil }
                head.inFlight = true
                guard gathers, state.queue.count > 1 else { return (head, nil) }
                var rest: [PendingWrite] = []
                var bytes = head.total - head.written
                for write in state.queue.dropFirst() {
                    guard rest.count + 1 < Self.gatherFrameLimit, bytes + write.total <= Self.gatherByteLimit else { break }
                    write.inFlight = true
                    rest.append(write)
                    bytes += write.total
                }
                return (head, rest.isEmpty ? nil : rest)
            }) else { return .empty }
            guard let rest else {
                #if os(Linux)
                if kernelFinishes, head.total - head.written >= Self.kernelFinishMinimum, finishInKernel(head) { return .inKernel }
                #endif
                guard writeSingle(head) else { return .blocked }
                continue
            }
            let batch = [head] + rest
            let count: Int
            do {
                count = try writeNow(ArraySlice(batch.map(\.frame)), from: head.written)
            } catch {
                writeState.withLock { _ in for write in batch { write.inFlight = false } }
                return .blocked
            }
            // The bytes written are a prefix of the batch: whole frames, then perhaps part of one.
            let (completed, cancelled): ([PendingWrite], [PendingWrite]) = writeState.withLock { state in
                var remaining = count
                var completed: [PendingWrite] = []
                var cancelled: [PendingWrite] = []
                for write in batch {
                    write.inFlight = false
                    let taken = min(remaining, write.total - write.written)
                    remaining -= taken
                    write.written += taken
                    state.queuedBytes -= taken
                    if write.written == write.total {
                        write.done = true
                        completed.append(write)
                    } else if write.written == 0, write.cancelRequested {
                        // Cancelled while in flight and none of it went: still not begun.
                        write.done = true
                        state.queuedBytes -= write.total
                        cancelled.append(write)
                    }
                }
                if !completed.isEmpty || !cancelled.isEmpty { state.queue.removeAll { $0.done } }
                return (completed, cancelled)
            }
            for write in completed { write.complete(.success(())) }
            for write in cancelled { write.complete(.failure(CancellationError())) }
            guard completed.count == batch.count else { return .blocked }
        }
    }

    /// Writes what the kernel takes of the queue's head alone (``writeQueued()``); returns
    /// whether it was finished.
    private func writeSingle(_ head: PendingWrite) -> Bool {
        let count: Int
        do {
            count = try writeNow(head.frame, from: head.written)
        } catch {
            writeState.withLock { _ in head.inFlight = false }
            return false
        }
        // The head stays the head while in flight: nothing else takes a frame out then.
        enum Outcome { case finished, cancelled, more }
        let outcome: Outcome = writeState.withLock { state in
            head.inFlight = false
            head.written += count
            state.queuedBytes -= count
            if head.written == 0, head.cancelRequested {
                // Cancelled while the kernel had no room for any of it: still not begun.
                state.queue.removeFirst()
                state.queuedBytes -= head.total
                head.done = true
                return .cancelled
            }
            guard head.written == head.total else { return .more }
            state.queue.removeFirst()
            head.done = true
            return .finished
        }
        switch outcome {
        case .finished: head.complete(.success(()))
        case .cancelled: head.complete(.failure(CancellationError()))
        case .more: break
        }
        return outcome == .finished
    }

    /// The rest of a frame from this size on goes to the kernel whole (``kernelFinishes``): a
    /// 1 MiB frame's rest, after the first write took what the socket's buffer had room for
    /// (about 200 KiB here), not a 64 KiB frame's, which the held writes batch.
    static let kernelFinishMinimum = 128 * 1024

    /// Whether the queue's head is the rest of a large frame for the kernel to finish: the loop
    /// is asked to flush at once rather than when the poller reports room. Under the lock.
    private func startsInKernel(_ state: WriteState) -> Bool {
        guard kernelFinishes, let head = state.queue.first, head.total - head.written >= Self.kernelFinishMinimum else { return false }
        return !eventLoop.noTransferRing
    }

    #if os(Linux)
    /// Hands the rest of the queue's head, marked in flight by ``writeQueued()``, to the kernel
    /// to finish (loop thread, the right to write held): one `sendmsg` with `MSG_WAITALL` on the
    /// loop's send ring, which the kernel goes on with as the peer makes room. The right to
    /// write stays taken until ``kernelWriteEnded(_:result:)``. Returns `false` if the ring did
    /// not take it (none, every slot in flight): it is then written as any other.
    private func finishInKernel(_ head: PendingWrite) -> Bool {
        guard kernelSlot == nil, let ring = eventLoop.transferRing() else { return false }
        let frame = head.frame
        let offset = head.written
        let fd = channel.writeDescriptor.rawValue
        let slot: Int? = try? channel.withEncodedHeader(of: frame) { header -> Int? in
            guard header.count + frame.payload.count == head.total else { return nil }
            return frame.payload.withUnsafeBytes { payload in
                let headerRest = offset < header.count ? UnsafeRawBufferPointer(rebasing: header[offset...]) : UnsafeRawBufferPointer(start: nil, count: 0)
                let payloadRest = UnsafeRawBufferPointer(rebasing: payload[max(0, offset - header.count)...])
                // The payload's bytes are the storage of `frame.payload`'s array, which the ring
                // keeps (with `frame`) until the completion; nothing changes it meanwhile.
                return ring.send(fd: fd, head: headerRest, payload: payloadRest, keeping: frame) { [self] result in
                    kernelWriteEnded(head, result: result)
                }
            }
        } ?? nil
        guard let slot else { return false }
        kernelSlot = slot
        // The completion reports the end: room to write is of no interest until then.
        writeState.withLock { state in
            if state.watchingWritable {
                state.watchingWritable = false
                applyInterest(state)
            }
        }
        return true
    }

    /// The kernel's send of the rest of the queue's head ended (loop thread): `result` is the
    /// bytes it sent, or `-errno`. All of it: the frame is written and the queue goes on. Part of
    /// it (the kernel may stop short, out of memory for one): the rest is written as any, from
    /// there. None, or an error: the connection broke, and the frame is torn.
    private func kernelWriteEnded(_ head: PendingWrite, result: Int) {
        kernelSlot = nil
        let expected = head.total - head.written
        enum Ending {
            case finished
            case more
            case closed
            case abandoned
            case failed(IPCError)
        }
        let ending: Ending = writeState.withLock { state in
            head.inFlight = false
            if state.closed {
                state.writerActive = false
                return .closed
            }
            if head.done {
                // Failed meanwhile by its deadline; the connection's end, on its way, closes.
                state.writerActive = false
                return .abandoned
            }
            if result > 0 {
                head.written += min(result, expected)
                state.queuedBytes -= min(result, expected)
            }
            if head.written == head.total {
                head.done = true
                if let index = state.queue.firstIndex(where: { $0 === head }) { state.queue.remove(at: index) }
                return .finished
            }
            if result > 0 { return .more }
            state.writerActive = false
            return .failed(Self.kernelWriteError(result, written: head.written, total: head.total))
        }
        switch ending {
        case .finished:
            head.complete(.success(()))
            writeWhileTaken()
        case .more:
            writeWhileTaken()
        case .closed:
            // Ended meanwhile (``finish(_:)`` failed the queue, this frame with it, and left
            // the closing to this writer).
            channel.close()
        case .abandoned:
            break
        case .failed(let error):
            // Ends the connection, which fails the queue, this frame first.
            failedWrite(error, torn: true)
        }
    }

    /// Hands the rest of the frame being read, if it is large, to the kernel to receive (loop
    /// thread, reading not paused): one `recv` with `MSG_WAITALL` on the loop's transfer ring,
    /// straight into the room the channel has for it. The loop stops watching the descriptor
    /// for bytes until ``kernelReadEnded(_:)``. Returns `false` if it did not (no ring, every
    /// slot in flight, the rest small or not known).
    private func readInKernel() -> Bool {
        guard kernelReadSlot == nil, !paused, !finished, let ring = eventLoop.transferRing(),
            let space = channel.kernelReadSpace(minimum: Self.kernelFinishMinimum)
        else { return false }
        let asked = space.count
        guard let slot = ring.receive(fd: channel.descriptor.rawValue, into: space, keeping: self, done: { [self] result in kernelReadEnded(result, asked: asked) }) else { return false }
        kernelReadSlot = slot
        updateInterest { $0.watchingReadable = false }
        return true
    }

    /// The kernel's receive of a frame's rest ended (loop thread): `result` bytes arrived of the
    /// `asked`, fewer if the stream ended or broke first (0: it had ended), or `-errno`.
    private func kernelReadEnded(_ result: Int, asked: Int) {
        kernelReadSlot = nil
        let stallCheck = kernelStallCheck
        kernelStallCheck = nil
        if finished { return }
        if result > 0 {
            channel.kernelReadEnded(result)
            bytesRead &+= UInt64(result)
        }
        if result < 0 {
            let error = Errno(rawValue: CInt(-result))
            if error == .canceled, let seen = stallCheck {
                // Stopped by the stall timer with nothing received: the check goes on as for
                // any read (a stalled peer is dropped; else the timer and the receive go on).
                let stall = core.options.stalledFrameTimeout ?? .seconds(30)
                checkStall(seen: seen, stall: stall)
                if !finished, kernelReadSlot == nil, !readInKernel() { updateInterest { $0.watchingReadable = true } }
                return
            }
            if error == .connectionReset {
                // What a socket's read says when the peer died with bytes unread.
                endOfStream()
            } else {
                invalidate(InvalidationReason(.transportFailure, error: IPCError(code: .transportFailure, message: "recv (the loop's transfer ring) failed: \(error)", cause: error)))
            }
            return
        }
        if result == 0 {
            endOfStream()
            return
        }
        // Reading goes on as after any read: whole frames first, then the descriptor again.
        guard dispatchFrames() else { return }
        if channel.hasPartialFrame { armStallTimer() }
        // Fewer than asked: the stream ended or broke, or the stall timer stopped the receive;
        // the descriptor says which (a read of it sees the end).
        if result == asked, channel.hasPartialFrame, readInKernel() { return }
        if result == asked, !channel.hasPartialFrame {
            // The frame is whole. In a stream of large frames the next one's start is usually
            // there already: one read now (as for a readiness report) takes it, and its rest goes
            // to the kernel in turn, with the descriptor never back in epoll's set (two
            // `epoll_ctl`s and an `epoll_wait` a frame). It is watched again only if that read
            // found nothing or what it found is not the start of another large frame.
            readSome()
            if finished || paused || kernelReadSlot != nil { return }
        }
        updateInterest { $0.watchingReadable = true }
    }

    private static func kernelWriteError(_ result: Int, written: Int, total: Int) -> IPCError {
        guard result < 0 else {
            return IPCError(code: .peerInvalidated, message: "the kernel sent nothing more of a frame after \(written) of its \(total) bytes: the connection broke")
        }
        let error = Errno(rawValue: CInt(-result))
        switch error {
        case .brokenPipe, .connectionReset, .socketNotConnected:
            return IPCError(code: .peerInvalidated, message: "the peer closed the connection", cause: error)
        default:
            return IPCError(code: .transportFailure, message: "sendmsg (the loop's send ring) failed after \(written) of a frame's \(total) bytes: \(error)", cause: error)
        }
    }
    #endif

    private func updateInterest(_ change: (inout WriteState) -> Void) {
        writeState.withLock { state in
            change(&state)
            applyInterest(state)
        }
    }

    /// Tells the loop what to watch for; called with the lock held, so changes apply in order.
    private func applyInterest(_ state: WriteState) {
        guard !state.closed else { return }
        // What reading asks of the descriptor: readable while not paused, or, for a channel
        // that does not read it, its end only (edge-triggered), always.
        let reading: Poller.Interest = readsDescriptor ? (state.watchingReadable ? .readable : []) : (watchesEnd ? [.readable, .edgeTriggered] : [])
        if let writeToken {
            eventLoop.setInterest(token, reading)
            eventLoop.setInterest(writeToken, state.watchingWritable && !retriesWrites ? .writable : [])
            return
        }
        if doorbell {
            // One bell for both directions: listen while either has something to wait for.
            eventLoop.setInterest(token, state.watchingReadable || state.watchingWritable ? [.readable, .edgeTriggered] : [])
            return
        }
        var interest = reading
        // Nothing to watch for room when writes are retried from a timer.
        if state.watchingWritable, !retriesWrites { interest.insert(.writable) }
        eventLoop.setInterest(token, interest)
    }
}

extension Sequence where Element == EngineConnection {
    /// Sends a one-way message to every connection and returns how many took it. A connection
    /// whose send fails is invalidated; the others still get the message.
    package func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        reduce(0) { delivered, connection in
            do {
                try connection.send(payload, msgid: msgid, timeout: timeout)
                return delivered + 1
            } catch {
                connection.invalidate(InvalidationReason(.transportFailure, error: error as? IPCError))
                return delivered
            }
        }
    }
}
