public import IPCCore
public import SystemPackage

/// What a transport supplies to the connection engine for one connection: a descriptor to wait
/// on, how to read what is there and cut it into frames, how to write a frame, how to close.
/// Everything else — request/reply correlation, timeouts, cancellation, the message stream and
/// its bound, invalidation, backpressure, replies from handlers — is ``EngineConnection``'s.
///
/// Threads: the reading requirements (``readAvailable()``, ``nextFrame()``,
/// ``hasPartialFrame``, ``finishReading()``) are called on the event loop's thread only.
/// ``write(_:from:)`` is called by one thread at a time (the engine serializes writers), from
/// any thread. ``close()`` is called once, when nothing else runs on the channel, and nothing
/// is called after it.
///
/// How the peer's death shows: as the end of the stream (``readAvailable()`` returns 0) or a
/// write error (``IPCError/Code/peerInvalidated``), which is what a socket gives when the peer's
/// process dies, whatever killed it.
public protocol EngineChannel: AnyObject, Sendable {
    /// The descriptor the loop waits on: readable when ``readAvailable()`` has something to
    /// read (or the peer hung up), writable when ``write(_:from:)`` can make progress; for a
    /// ``ChannelReadiness/doorbell`` channel, rung when either may have changed.
    var descriptor: FileDescriptor { get }

    /// How ``descriptor`` reports progress. `.level` (a socket's) unless the channel says otherwise.
    var readiness: ChannelReadiness { get }

    /// Where inbound bytes come from: read from ``descriptor`` (`.descriptor`, the default),
    /// handed over by whoever reads a descriptor that several connections share (`.delivered`),
    /// or read by the channel from where it keeps them when it says so (`.pulled`); see
    /// ``EngineConnection/readNow()``.
    var inbound: ChannelInbound { get }

    /// For a channel that does not read its descriptor (``ChannelInbound/delivered``,
    /// ``ChannelInbound/pulled``): whether the loop watches the descriptor all the same, for the
    /// peer's end only (a rendezvous socket both sides keep open for the connection's life).
    /// The watch is edge-triggered: each report calls ``descriptorReported()`` once, then the
    /// engine reads (``readAvailable()``) unless reading is paused, so the channel must remember
    /// what it saw. `false` unless the channel says otherwise.
    var watchesDescriptorForEnd: Bool { get }

    /// The descriptor watched for the end (``watchesDescriptorForEnd``) was reported readable:
    /// look at it now, without blocking (loop thread). The default does nothing.
    func descriptorReported()

    /// How a write that took less than it was given learns that it can go on: when the
    /// descriptor written to is writable (`.descriptor`, the default), or by trying again from
    /// a loop timer (`.retried`: nothing can be watched for room, as with a file's lock and a
    /// journal's capacity).
    var writeWait: ChannelWriteWait { get }

    /// The descriptor ``write(_:from:)`` writes to, when it is not ``descriptor`` (a message
    /// queue read one way and written the other): the loop watches it for room on a
    /// registration of its own. ``descriptor`` unless the channel says otherwise.
    var writeDescriptor: FileDescriptor { get }

    /// The connection is ending, for `reason` (the final one): called once, on the loop's
    /// thread, before ``close()``, so that ``close()`` can say goodbye to a peer that did not
    /// end it. The default does nothing.
    func ending(_ reason: InvalidationReason)

    /// Reads what the kernel holds, without blocking: the number of bytes read, `0` at the end
    /// of the stream, `nil` if nothing was there.
    /// - Throws: ``IPCError/Code/transportFailure`` if the read fails; a typed framing error
    ///   (``IPCError/Code/frameTooLarge``, ``IPCError/Code/malformedFrame``) if the bytes can
    ///   already be seen to be wrong.
    func readAvailable() throws -> Int?

    /// The next whole frame among the bytes read so far, or `nil` if there is none yet.
    /// - Throws: a typed framing error; the engine then invalidates the connection.
    func nextFrame() throws -> Frame?

    /// ``nextFrame()``, lending the frame's payload in place first (for a
    /// ``ConnectionOptions/makeOnLoopBorrowingMessageHandler``): `lend` is given the header and the
    /// payload, valid during the call only, and returns whether it took the frame; a frame it
    /// took is ``ReassembledFrame/lent``, one it did not is returned with a payload of its own.
    /// The default lends the payload of ``nextFrame()``'s frame, from that frame's own array.
    /// - Throws: as ``nextFrame()``.
    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame?

    /// Whether part of a frame has been read and not the rest: the engine drops a peer that
    /// stalls there (``ConnectionOptions/stalledFrameTimeout``).
    var hasPartialFrame: Bool { get }

    /// The stream ended.
    /// - Throws: ``IPCError/Code/truncatedFrame`` if it ended inside a frame.
    func finishReading() throws

    /// The number of bytes `frame` takes on the wire.
    /// - Throws: ``IPCError/Code/payloadTooLarge`` if the payload is above what the channel
    ///   carries; the frame is then not sent.
    func encodedLength(of frame: Frame) throws -> Int

    /// Writes as much of `frame`'s encoding, from byte `offset` on, as the kernel takes now,
    /// without blocking; returns how many bytes it took (0 if none). A channel that carries
    /// each frame in one datagram writes all of it or nothing.
    /// - Throws: ``IPCError/Code/peerInvalidated`` if the peer is gone;
    ///   ``IPCError/Code/transportFailure`` for any other failure.
    func write(_ frame: Frame, from offset: Int) throws -> Int

    /// Whether ``write(_:from:)-(ArraySlice<Frame>,_)`` gathers several frames into one system
    /// call: the engine then hands it every frame that is ready to go (at most 64 frames and
    /// 256 KiB a call), and a frame a call otherwise. `false` unless the channel says otherwise.
    var gathersWrites: Bool { get }

    /// For a channel that ``gathersWrites``: the most bytes of small frames (each counted by
    /// ``encodedLength(of:)``) the engine may hold back from one-way `async` sends made on the
    /// loop's thread, to write them together in one call at the end of the loop's round
    /// (``EngineConnection/send(_:msgid:timeout:)-async``), or at once when the next would go
    /// over. Frames above it, up to 65 KiB (a 64 KiB payload and its header), are held in batches
    /// of their own, at most 8 frames and 256 KiB. Choose the size up to which the channel writes
    /// frames together as one copy.
    /// 0 (the default): every send writes at once.
    var heldWriteLimit: Int { get }

    /// Writes as much of `frames`' encodings, one after another, from byte `offset` of the
    /// first, as the kernel takes now, without blocking; returns how many bytes it took in all
    /// (0 if none). Called, for a channel that ``gathersWrites``, with frames whose
    /// ``encodedLength(of:)`` the engine checked, by one thread at a time as
    /// ``write(_:from:)`` is. The default writes them with ``write(_:from:)``, one after
    /// another, while each is taken whole.
    /// - Throws: as ``write(_:from:)``, when nothing of this call was written.
    func write(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int

    /// Whether the rest of a large frame may be handed to the kernel to move, through the loop's
    /// transfer ring (``EventLoop/LargeTransfers/ioUring``; docs/ENGINE.md, "Large frames in the
    /// kernel's hands"): for a stream socket, as ``descriptor`` and ``writeDescriptor``, whose
    /// frames are written as ``withEncodedHeader(of:_:)``'s header followed by the payload, and
    /// read as ``kernelReadSpace(minimum:)`` says. `false` unless the channel says otherwise.
    var kernelFinishesWrites: Bool { get }

    /// For a channel that ``kernelFinishesWrites``: the room for exactly the rest of the frame
    /// being read, if that is known and at least `minimum` bytes (loop thread). The engine has
    /// the kernel fill it from ``descriptor`` and then calls ``kernelReadEnded(_:)``; until then
    /// the room stays valid and nothing else reads. `nil` (the default): none.
    func kernelReadSpace(minimum: Int) -> UnsafeMutableRawBufferPointer?

    /// `count` bytes arrived in the room ``kernelReadSpace(minimum:)`` gave, from its start (loop
    /// thread); they count as read, as ``readAvailable()``'s. The default does nothing.
    func kernelReadEnded(_ count: Int)

    /// For a channel that ``kernelFinishesWrites``: calls `body` with the header bytes that
    /// ``write(_:from:)`` writes before `frame`'s payload, valid during the call only (the
    /// engine copies what it needs). Called by one thread at a time, as ``write(_:from:)`` is.
    /// - Throws: what encoding the header throws (the default throws
    ///   ``IPCError/Code/transportFailure``: the channel does not finish writes in the kernel).
    func withEncodedHeader<R>(of frame: Frame, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R

    /// Wakes whatever waits on the descriptor (a reader sees the end of the stream, a writer an
    /// error), without closing it: the engine closes later, once nothing uses it.
    func shutdown()

    /// Closes the descriptor.
    func close()

    /// Lets the event loop, while it spins (``WaitStrategy/spinThenBlock(_:)``), look for
    /// something to read itself with ``pollWhileSpinning()`` instead of asking the kernel's
    /// readiness list. Called once, before the channel is registered, for a connection whose
    /// wait strategy spins. The default returns `false`. A channel that agrees returns `true`:
    /// - a ``ChannelReadiness/doorbell`` channel then no longer asks for a ring after its
    ///   reads; the loop calls ``armBeforeSleep()`` before it sleeps, so a writer to a spinning
    ///   reader rings no bell;
    /// - a socket then reads in ``pollWhileSpinning()`` and hands what it read to the next
    ///   ``readAvailable()``: one system call when a message arrives, as a spinning C reader
    ///   makes, instead of a readiness report and then a read.
    func startPollingWhileSpinning() -> Bool

    /// Whether there is something to read (or the stream ended): for a doorbell channel,
    /// unread bytes or a goodbye seen in shared memory, without a system call; for a socket,
    /// a non-blocking read whose outcome the next ``readAvailable()`` returns (``PolledRead``
    /// keeps it: the count, or the error, which that call then throws). Called on the
    /// loop's thread, after ``startPollingWhileSpinning()`` agreed, never while reading is
    /// paused or after the connection finished.
    func pollWhileSpinning() -> Bool

    /// The loop is about to sleep: a doorbell channel asks the peer to ring from now on, then
    /// looks once more. Returns whether there is something to read already (the loop then
    /// reads instead of sleeping). A socket has nothing to arm: `false`. Called on the loop's
    /// thread, after ``startPollingWhileSpinning()`` agreed.
    func armBeforeSleep() -> Bool
}

/// Where an ``EngineChannel``'s inbound bytes come from.
public enum ChannelInbound: Sendable {
    /// From ``EngineChannel/descriptor``, read by the loop when it is readable.
    case descriptor
    /// From a reader that serves several connections (a listener reading one queue that every
    /// client writes to): it hands this connection's bytes to the channel, then calls
    /// ``EngineConnection/readNow()`` on the loop's thread, which reads them as
    /// ``EngineChannel/readAvailable()`` returns them. Such a connection cannot stop reading
    /// (the shared reader serves the others): when the application leaves
    /// ``ConnectionOptions/messageBufferLimit`` messages untaken, it ends with
    /// ``IPCError/Code/receiveBufferFull``.
    case delivered
    /// From where the channel keeps them (a journal file), read when the channel says there is
    /// something (``EngineConnection/readNow()`` on the loop's thread: a file watch fired, a
    /// retry timer) and when its descriptor reports the peer's end
    /// (``EngineChannel/watchesDescriptorForEnd``). Such a connection pauses like one that
    /// reads its descriptor: while ``ConnectionOptions/messageBufferLimit`` messages wait, it
    /// reads nothing, and when the application makes room it reads again by itself. The channel
    /// keeps one promise: a ``EngineChannel/readAvailable()`` that leaves something behind (a
    /// locked file, the end still to report) calls ``EngineConnection/readNow()`` again later.
    case pulled
}

/// How the engine learns that a channel's writes can go on after one took less than it was given.
public enum ChannelWriteWait: Sendable {
    /// The ``EngineChannel/writeDescriptor`` is writable (or, for a doorbell, its bell rang).
    case descriptor
    /// Nothing says so: the loop tries the waiting frames again from a timer, 10 µs after the
    /// first try that found no room, doubling to 1 ms between tries, until they are written or
    /// their deadlines pass.
    case retried
}

/// How an ``EngineChannel``'s descriptor tells the loop that there is something to do.
public enum ChannelReadiness: Sendable {
    /// A socket's way: readable while there is something to read, writable while there is room.
    case level
    /// A doorbell's way (an eventfd the peer rings, for a channel whose bytes are in shared
    /// memory): each ring is reported once (the loop registers it edge-triggered) and means
    /// "look again" in both directions. The engine then reads and writes what is pending on
    /// every ring. The channel must keep two promises, or a connection stalls:
    /// ``EngineChannel/readAvailable()`` takes everything there is, or rings its own bell for
    /// the rest; and a ``EngineChannel/write(_:from:)`` that takes less than it was given makes
    /// sure the bell rings when room appears (asking the peer to ring, then looking once more
    /// and ringing itself if the room came meanwhile).
    case doorbell
}

extension EngineChannel {
    public var readiness: ChannelReadiness { .level }
    public var inbound: ChannelInbound { .descriptor }
    public var writeDescriptor: FileDescriptor { descriptor }
    public var watchesDescriptorForEnd: Bool { false }
    public func descriptorReported() {}
    public var writeWait: ChannelWriteWait { .descriptor }
    public func ending(_ reason: InvalidationReason) {}

    public var gathersWrites: Bool { false }
    public var heldWriteLimit: Int { 0 }
    public var kernelFinishesWrites: Bool { false }
    public func kernelReadSpace(minimum: Int) -> UnsafeMutableRawBufferPointer? { nil }
    public func kernelReadEnded(_ count: Int) {}
    public func withEncodedHeader<R>(of frame: Frame, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        throw IPCError(code: .transportFailure, message: "\(type(of: self)) does not hand frames to the kernel to finish")
    }

    public func write(_ frames: ArraySlice<Frame>, from offset: Int) throws -> Int {
        var written = 0
        var offset = offset
        for frame in frames {
            do {
                let length = try encodedLength(of: frame)
                let count = try write(frame, from: offset)
                written += count
                guard offset + count == length else { return written }
                offset = 0
            } catch {
                // What went before the failure counts; the next write meets the failure again.
                if written > 0 { return written }
                throw error
            }
        }
        return written
    }

    public func startPollingWhileSpinning() -> Bool { false }
    public func pollWhileSpinning() -> Bool { false }
    public func armBeforeSleep() -> Bool { false }

    public func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        guard let frame = try nextFrame() else { return nil }
        // Lent from the frame's own array: the same call and guarantees, one allocation a frame.
        return frame.payload.withUnsafeBytes { lend(FrameHeader(frame), $0) } ? .lent : .owned(frame)
    }
}
