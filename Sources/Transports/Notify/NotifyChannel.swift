import CIPCShims
import Glibc
import IPCCore
public import IPCEngine
import IPCFraming
import IPCSystem
import SystemPackage

/// A connection of the notify transport: an ``EngineConnection`` over a ``NotifyChannel``. The
/// event loop waits on this side's doorbell with every other connection of the process.
public typealias NotifyConnection = EngineConnection

/// What the engine needs of one notify connection: frames in the shared store's rings, and two
/// doorbells (eventfds, the Linux counterpart of `notify_register_file_descriptor`): this
/// side's, which the loop waits on (edge-triggered), and the peer's, which this side rings.
///
/// A ring means "look again" and is rung only when the other side said it is about to wait
/// (``NotifyStore/Ring/readerWillWait()``, ``NotifyStore/Ring/writerWillWait()``), so a busy
/// reader costs its writer no system call. The bells' counters are never read: with an
/// edge-triggered registration every ring is one report, whatever the count.
final class NotifyChannel: EngineChannel, @unchecked Sendable {
    // @unchecked: the reassembler is used on the loop's thread only; `write` runs on one thread
    // at a time (EngineChannel's contract); the store is shared memory reached through atomics.

    let descriptor: FileDescriptor
    var readiness: ChannelReadiness { .doorbell }

    private let store: NotifyStore
    private let inbound: NotifyStore.Ring
    private let outbound: NotifyStore.Ring
    private let peerBell: CInt
    private let encoder: BinaryFrameEncoder
    private let reassembler: FrameReassembler<BinaryFrameDecoder>
    /// The spinning loop looks at the inbound ring itself and asks for rings only before it
    /// sleeps (``startPollingWhileSpinning()``); set once, before registration.
    private var loopPolls = false

    /// - Parameters:
    ///   - ownBell: the eventfd this side waits on; the channel closes it.
    ///   - peerBell: the eventfd the peer waits on; the channel closes it.
    init(store: NotifyStore, isClient: Bool, ownBell: CInt, peerBell: CInt, maximumPayloadLength: Int) {
        self.store = store
        self.descriptor = FileDescriptor(rawValue: ownBell)
        self.peerBell = peerBell
        inbound = isClient ? store.serverToClient : store.clientToServer
        outbound = isClient ? store.clientToServer : store.serverToClient
        encoder = BinaryFrameEncoder(maximumPayloadLength: maximumPayloadLength)
        reassembler = FrameReassembler(decoder: BinaryFrameDecoder(maximumPayloadLength: maximumPayloadLength))
    }

    /// Rings a doorbell. A full counter (2^64 − 2 rings unread, which only a hostile peer can
    /// cause) already reads as rung.
    static func ring(_ bell: CInt) {
        var one: UInt64 = 1
        _ = ipc_sys_write(bell, &one, 8)
    }

    func readAvailable() throws -> Int? {
        guard store.isIntact else {
            throw IPCError(code: .malformedFrame, message: "the notify store was overwritten (its magic or version changed)")
        }
        let count = try reassembler.receive { try inbound.read(into: $0) }
        if count > 0, inbound.takeWriterWaiting() { Self.ring(peerBell) }
        if loopPolls {
            // The loop sees what is left (and a goodbye) in memory, and arms before it sleeps.
            if count > 0 { return count }
            return store.state == .closed ? 0 : nil
        }
        // About to wait: ask for a ring, then look once more, so that bytes published meanwhile
        // (whose writer saw no request) are not left unread; what did not fit in this read, and
        // a goodbye behind the last bytes, come back through our own bell.
        inbound.readerWillWait()
        let closed = store.state == .closed
        if inbound.hasUnread || (count > 0 && closed) { Self.ring(descriptor.rawValue) }
        if count > 0 { return count }
        return closed ? 0 : nil
    }

    func startPollingWhileSpinning() -> Bool {
        loopPolls = true
        return true
    }

    /// In shared memory only: no system call.
    func pollWhileSpinning() -> Bool {
        inbound.hasUnread || store.state == .closed
    }

    func armBeforeSleep() -> Bool {
        inbound.readerWillWait()
        return pollWhileSpinning()
    }

    func nextFrame() throws -> Frame? {
        try reassembler.nextFrame()
    }

    func nextFrame(lending lend: (FrameHeader, UnsafeRawBufferPointer) -> Bool) throws -> ReassembledFrame? {
        try reassembler.nextFrame(lending: lend)
    }

    var hasPartialFrame: Bool { reassembler.bufferedByteCount > 0 }

    func finishReading() throws {
        try reassembler.finish()
    }

    func encodedLength(of frame: Frame) throws -> Int {
        // The length check alone: the header is encoded once, when the frame is written.
        try encoder.encodedHeaderLength(FrameHeader(frame)) + frame.payload.count
    }

    func write(_ frame: Frame, from offset: Int) throws -> Int {
        guard store.state != .closed else {
            throw IPCError(code: .peerInvalidated, message: "the peer closed the connection")
        }
        var header = try encoder.headerBytes(FrameHeader(frame))
        let total = BinaryFrameHeaderBytes.count + frame.payload.count
        // A frame that fits in the ring goes in whole or not at all, so a send that times out
        // has written nothing and the connection stays usable; a larger one is streamed through.
        if offset == 0, total <= outbound.capacity, !outbound.hasRoom(for: total) {
            waitForRoom(total)
            return 0
        }
        let taken = try withUnsafeBytes(of: &header.storage) { raw in
            try frame.payload.withUnsafeBytes { payload in
                try outbound.write(header: UnsafeRawBufferPointer(rebasing: raw[..<BinaryFrameHeaderBytes.count]), payload: payload, from: offset)
            }
        }
        if taken > 0, outbound.takeReaderWaiting() { Self.ring(peerBell) }
        if offset + taken < total { waitForRoom(1) }
        return taken
    }

    /// The ring lacks room for `count` bytes: asks the reader to ring when it has made some,
    /// then looks once more, in case it did in between.
    private func waitForRoom(_ count: Int) {
        outbound.writerWillWait()
        if outbound.hasRoom(for: count) { Self.ring(descriptor.rawValue) }
    }

    func shutdown() {
        Self.ring(descriptor.rawValue)
    }

    /// Whether the store is still sound (see ``NotifyStore/isSound``). Loop thread.
    var storeIsSound: Bool { store.isSound }

    /// Says goodbye (the store's state, and a ring), then closes both bells and unmaps the store.
    func close() {
        store.close()
        Self.ring(peerBell)
        try? FileDescriptor(rawValue: peerBell).close()
        try? descriptor.close()
        store.unmap()
    }
}
