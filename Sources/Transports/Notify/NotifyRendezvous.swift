import CIPCShims
import Glibc
import IPCCore
import IPCEngine
import IPCSystem
import SystemPackage

/// How a notify connection is set up: over the endpoint's rendezvous socket
/// (`G/<name>.rendezvous`, an `AF_UNIX` stream socket), the client sends a hello with three
/// descriptors — the sealed store and both doorbells — and the listener answers with one status
/// word. The socket is closed after that; it serves to hand the descriptors over and to give
/// both sides the other's kernel-verified credentials (`SO_PEERCRED`). See docs/WIRE-FORMAT.md,
/// section 6.
enum NotifyRendezvous {
    /// Hello: magic, version, ring capacity, zero; four 32-bit words, little-endian.
    static let helloLength = 16
    /// The descriptors that come with a hello, in this order.
    static let descriptorCount = 3

    static func socketPath(_ endpoint: Endpoint) -> String {
        endpoint.path(suffix: ".rendezvous")
    }

    static func hello(ringCapacity: Int) -> [UInt8] {
        [NotifyStore.magic, NotifyStore.version, UInt32(ringCapacity), 0].flatMap { withUnsafeBytes(of: $0.littleEndian, Array.init) }
    }

    /// The ring capacity a hello announces, if it is this version's hello.
    static func ringCapacity(ofHello bytes: ArraySlice<UInt8>) -> Int? {
        guard bytes.count == helloLength else { return nil }
        let words = stride(from: bytes.startIndex, to: bytes.endIndex, by: 4).map { start in
            bytes[start..<start + 4].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        }
        guard words[0] == NotifyStore.magic, words[1] == NotifyStore.version, words[3] == 0 else { return nil }
        return Int(words[2])
    }

    /// The client's side: makes the store and the doorbells, hands them to the listener on
    /// `socket`, and waits for its answer.
    /// - Returns: the store and this side's (own) and the listener's (peer) doorbells.
    /// - Throws: ``IPCError/Code/accessDenied`` if the accept filter refused;
    ///   ``IPCError/Code/endpointNotFound`` made with ``IPCError/listenerBusy(_:answered:)`` if the
    ///   listener was full, or did not answer in time while a process holds the endpoint;
    ///   ``IPCError/Code/transportFailure``.
    /// `deadline` (``IPCSystem/monotonicNanoseconds()``) ends the wait for the answer; `claimed`:
    /// whether a process holds the endpoint, asked if no answer came in time (the listener runs
    /// and is busy, else the socket is nobody's listener).
    static func connect(socket: FileDescriptor, ringCapacity: Int, storeLabel: String, deadline: UInt64, claimed: () -> Bool) throws -> (store: NotifyStore, ownBell: CInt, peerBell: CInt) {
        let (store, memfd) = try NotifyStore.create(ringCapacity: ringCapacity, label: storeLabel)
        defer { try? FileDescriptor(rawValue: memfd).close() }
        let ownBell = eventfd(0, CInt(EFD_CLOEXEC) | CInt(EFD_NONBLOCK))
        let peerBell = eventfd(0, CInt(EFD_CLOEXEC) | CInt(EFD_NONBLOCK))
        guard ownBell >= 0, peerBell >= 0 else {
            let error = Errno(rawValue: errno)
            if ownBell >= 0 { try? FileDescriptor(rawValue: ownBell).close() }
            if peerBell >= 0 { try? FileDescriptor(rawValue: peerBell).close() }
            throw IPCError.syscall("eventfd", error)
        }
        do {
            let hello = Self.hello(ringCapacity: ringCapacity)
            let descriptors = [memfd, peerBell, ownBell]
            let sent = hello.withUnsafeBytes { bytes in
                descriptors.withUnsafeBufferPointer { ipc_send_with_descriptors(socket.rawValue, bytes.baseAddress, UInt(bytes.count), $0.baseAddress, CInt($0.count)) }
            }
            // A listener that refuses at once (accept filter, busy) may have answered and closed
            // before the hello went: the answer is still there to read.
            guard sent == helloLength || errno == EPIPE || errno == ECONNRESET else {
                throw IPCError(code: .transportFailure, message: "the notify hello was not sent whole (errno \(errno))")
            }
            try RendezvousStatus.awaitAcceptance(on: socket, deadline: deadline, listener: "notify", claimed: claimed)
            return (store, ownBell, peerBell)
        } catch {
            try? FileDescriptor(rawValue: ownBell).close()
            try? FileDescriptor(rawValue: peerBell).close()
            throw error
        }
    }
}
