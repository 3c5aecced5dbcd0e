import Foundation
import IPCCore
import IPCEngine
import IPCTestSupport
import Synchronization

/// One rule a ``BrokenTransport`` breaks, on purpose, so that a test can check that the case
/// for that rule fails.
enum Violation: String, Sendable, CaseIterable {
    case dropsAMessage, duplicatesAMessage, reordersMessages, corruptsLargePayloads
    /// Declares a 1 MiB maximum but sends anything.
    case ignoresItsMaximum
    /// Listens without the accept filter it is given.
    case ignoresAcceptFilter
    /// Runs the accept filter on the event loop's thread, which serves every connection.
    case filtersOnTheLoop
    /// Listens without the connection limit it is given (and still declares one).
    case ignoresConnectionLimit
    /// A full listener's busy answer reaches the client as a plain endpointNotFound, without
    /// ``IPCError/ListenerBusy``: it reads as nobody listening.
    case busyLooksLikeNobody
    /// A connect to a listener that runs but does not answer (its process stopped) fails, after
    /// a second, with a plain endpointNotFound, as a handshake that took its timeout for nobody
    /// listening would.
    case silenceLooksLikeNobody
    /// Listens without the borrowing message handler it is given.
    case ignoresBorrowingHandler
    /// Connects without the borrowing message handler it is given.
    case connectsWithoutBorrowingHandler
    case broadcastsToOne
    /// Listens with no payload limit, so hostile lengths are not refused.
    case acceptsHostileLengths
    /// Reports protocol errors as a clean close.
    case hidesProtocolErrors
    /// Each request returns the previous request's reply.
    case strayReplies
    case failuresLookLikeTimeouts
    /// A receive timeout is reported as a send timeout.
    case wrongTimeoutCode
    /// A send timeout is reported as a transport failure.
    case sendTimeoutAsFailure
    /// A live endpoint's second listener gets transportFailure, not endpointInUse.
    case wrongEndpointInUseCode
    /// Refuses to listen where a dead listener's socket file is left.
    case refusesStaleEndpoints
    case wrongEndpointNotFoundCode
    /// A refusal by the accept filter reaches the client as peerInvalidated, like a crash.
    case refusalLooksLikeACrash
    /// A connect to an endpoint nobody listens at waits 6 s before it fails.
    case slowToFindNobody
    case neverInvalidates, invalidatesTwice
    case sendsAfterInvalidation
    /// A handler set after invalidation never runs.
    case ignoresLateHandlers
    /// Requests keep waiting after their connection became invalid.
    case requestsOutliveTheConnection
    /// Each connection opens a descriptor it never closes.
    case leaksADescriptor
    /// Declares that it watches the peer's process, while it only sees end of file.
    case claimsProcessWatch
    /// Keeps invalidated connections in its active list.
    case keepsDeadConnections
    /// The listener closes when any client dies.
    case serverQuitsOnClientDeath
    /// The suspending send waits for room on a thread of its own, one per waiting send.
    case waitsOnAThreadPerSend
}

/// A real transport that breaks one rule (``Violation``), for showing that the suite notices.
struct BrokenTransport<Base: MessageTransport>: MessageTransport {
    typealias Connection = BrokenConnection
    typealias Listener = BrokenListener<Base.Listener>

    let base: Base
    let violation: Violation

    var name: String { "broken(\(violation))" }

    var capabilities: TransportCapabilities {
        var capabilities = base.capabilities
        switch violation {
        case .ignoresItsMaximum: capabilities.maximumPayloadLength = 1 << 20
        case .claimsProcessWatch: capabilities.peerDeathDetection = .processWatch
        default: break
        }
        return capabilities
    }

    func listen(at endpoint: Endpoint, options: ConnectionOptions, acceptFilter: AcceptFilter?) throws -> Listener {
        var options = options
        if violation == .acceptsHostileLengths { options.maximumPayloadLength = Int(Int32.max) }
        if violation == .ignoresBorrowingHandler { options.makeOnLoopBorrowingMessageHandler = nil }
        if violation == .ignoresConnectionLimit { options.maximumConnections = nil }
        if violation == .refusesStaleEndpoints, FileManager.default.fileExists(atPath: endpoint.path(suffix: ".sock")) {
            throw IPCError(code: .endpointInUse, message: "a socket file is in the way")
        }
        do {
            var filter = violation == .ignoresAcceptFilter ? nil : acceptFilter
            if violation == .filtersOnTheLoop, let acceptFilter {
                // The loop's thread waits for the filter's answer, as if it had called it.
                filter = { credentials in
                    let answered = DispatchSemaphore(value: 0)
                    let answer = Mutex(false)
                    guard let loop = try? EventLoop.shared() else { return acceptFilter(credentials) }
                    loop.execute {
                        answer.withLock { $0 = acceptFilter(credentials) }
                        answered.signal()
                    }
                    answered.wait()
                    return answer.withLock { $0 }
                }
            }
            return BrokenListener(try base.listen(at: endpoint, options: options, acceptFilter: filter), violation: violation)
        } catch let error as IPCError where violation == .wrongEndpointInUseCode && error.code == .endpointInUse {
            throw IPCError(code: .transportFailure, message: error.message)
        }
    }

    func connect(to endpoint: Endpoint, options: ConnectionOptions) throws -> Connection {
        var options = options
        if violation == .ignoresItsMaximum { options.maximumPayloadLength = base.capabilities.maximumPayloadLength }
        if violation == .connectsWithoutBorrowingHandler { options.makeOnLoopBorrowingMessageHandler = nil }
        do {
            let connection = try base.connect(to: endpoint, options: options)
            if violation == .silenceLooksLikeNobody, let pid = connection.peer?.pid, isStopped(pid) {
                connection.invalidate()
                Thread.sleep(forTimeInterval: 1)
                throw IPCError(code: .endpointNotFound, message: "the listener did not answer within the connect timeout")
            }
            return BrokenConnection(connection, violation: violation)
        } catch let error as IPCError where violation == .wrongEndpointNotFoundCode && error.code == .endpointNotFound {
            throw IPCError(code: .transportFailure, message: error.message)
        } catch let error as IPCError where violation == .busyLooksLikeNobody && error.isListenerBusy {
            throw IPCError(code: .endpointNotFound, message: error.message)
        } catch let error as IPCError where violation == .slowToFindNobody && error.code == .endpointNotFound {
            Thread.sleep(forTimeInterval: 6)
            throw error
        }
    }

}

final class BrokenListener<Base: MessageListener>: MessageListener, Sendable {
    let base: Base
    let violation: Violation
    let connections: AsyncStream<BrokenConnection>
    private let wrapped = Mutex<[ObjectIdentifier: BrokenConnection]>([:])

    init(_ base: Base, violation: Violation) {
        self.base = base
        self.violation = violation
        let (stream, continuation) = AsyncStream.makeStream(of: BrokenConnection.self)
        connections = stream
        Task { [weak self] in
            for await connection in base.connections {
                let broken = BrokenConnection(connection, violation: violation)
                if violation == .serverQuitsOnClientDeath {
                    broken.onPeerGone = { [weak self] in self?.close() }
                }
                self?.wrapped.withLock { $0[ObjectIdentifier(connection)] = broken }
                continuation.yield(broken)
            }
            continuation.finish()
        }
    }

    var endpoint: Endpoint { base.endpoint }

    var activeConnections: [BrokenConnection] {
        let all = wrapped.withLock { $0 }
        if violation == .keepsDeadConnections { return Array(all.values) }
        return base.activeConnections.compactMap { all[ObjectIdentifier($0)] }
    }

    func broadcast(_ payload: [UInt8], msgid: UInt32, timeout: Duration) -> Int {
        guard violation == .broadcastsToOne else { return base.broadcast(payload, msgid: msgid, timeout: timeout) }
        let active = activeConnections
        try? active.first?.send(payload, msgid: msgid, timeout: timeout)
        return active.count
    }

    func close() { base.close() }
}

final class BrokenConnection: MessageConnection, Sendable {
    let base: any MessageConnection
    let violation: Violation
    let messages: AsyncStream<ReceivedMessage>
    /// Called when the peer goes away, for ``Violation/serverQuitsOnClientDeath``.
    var onPeerGone: (@Sendable () -> Void)? {
        get { peerGone.withLock { $0 } }
        set { peerGone.withLock { $0 = newValue } }
    }

    private let peerGone = Mutex<(@Sendable () -> Void)?>(nil)
    private let previousReply = Mutex<[UInt8]?>(nil)

    init(_ base: any MessageConnection, violation: Violation) {
        self.base = base
        self.violation = violation
        let (stream, continuation) = AsyncStream.makeStream(of: ReceivedMessage.self)
        messages = stream
        if violation == .leaksADescriptor { _ = open("/dev/null", O_RDONLY) }
        let baseMessages = base.messages
        Task {
            var index = 0
            var held: ReceivedMessage?
            for await message in baseMessages {
                defer { index += 1 }
                switch (violation, index) {
                case (.dropsAMessage, 10): continue
                case (.duplicatesAMessage, 10): continuation.yield(message)
                case (.reordersMessages, 10): held = message; continue
                default: break
                }
                continuation.yield(message)
                if let message = held {
                    continuation.yield(message)
                    held = nil
                }
            }
            continuation.finish()
        }
    }

    var peer: PeerCredentials? { base.peer }

    var invalidationReason: InvalidationReason? { base.invalidationReason.map { Self.disguise($0, violation) } }

    private static func disguise(_ reason: InvalidationReason, _ violation: Violation) -> InvalidationReason {
        violation == .hidesProtocolErrors && reason.kind == .protocolError ? InvalidationReason(.peerClosed) : reason
    }

    func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) throws {
        if violation == .sendsAfterInvalidation, base.invalidationReason != nil { return }
        do {
            try base.send(payload, msgid: msgid, timeout: timeout)
        } catch let error as IPCError where violation == .sendTimeoutAsFailure && error.code == .sendTimeout {
            throw IPCError(code: .transportFailure, message: error.message)
        }
    }

    func send(_ payload: [UInt8], msgid: UInt32, timeout: Duration) async throws {
        guard violation == .waitsOnAThreadPerSend else {
            return try await base.send(payload, msgid: msgid, timeout: timeout)
        }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            Thread.detachNewThread { [base] in
                continuation.resume(with: Result { try base.send(payload, msgid: msgid, timeout: timeout) })
            }
        }
    }

    func request(_ payload: [UInt8], msgid: UInt32, sendTimeout: Duration, receiveTimeout: Duration) async throws -> [UInt8] {
        do {
            var reply = try await base.request(payload, msgid: msgid, sendTimeout: sendTimeout, receiveTimeout: receiveTimeout)
            switch violation {
            case .strayReplies:
                let previous = previousReply.withLock { stored in
                    defer { stored = reply }
                    return stored
                }
                return previous ?? reply
            case .corruptsLargePayloads where reply.count > 1 << 20:
                reply[reply.count / 2] ^= 0xFF
                return reply
            default:
                return reply
            }
        } catch let error as IPCError {
            switch (violation, error.code) {
            case (.wrongTimeoutCode, .receiveTimeout):
                throw IPCError(code: .sendTimeout, message: error.message)
            case (.failuresLookLikeTimeouts, .transportFailure):
                throw IPCError(code: .receiveTimeout, message: error.message)
            case (.refusalLooksLikeACrash, .accessDenied):
                throw IPCError(code: .peerInvalidated, message: error.message)
            case (.busyLooksLikeNobody, .endpointNotFound):
                throw IPCError(code: .endpointNotFound, message: error.message)
            case (.requestsOutliveTheConnection, .peerInvalidated), (.requestsOutliveTheConnection, .invalidated):
                try await Task.sleep(for: .seconds(30))
                throw error
            default:
                throw error
            }
        }
    }

    func setInvalidationHandler(_ handler: @escaping @Sendable (InvalidationReason) -> Void) {
        switch violation {
        case .neverInvalidates:
            return
        case .ignoresLateHandlers where base.invalidationReason != nil:
            return
        default:
            break
        }
        base.setInvalidationHandler { [violation, weak self] reason in
            if reason.kind == .peerClosed || reason.kind == .peerDied || reason.kind == .protocolError {
                self?.onPeerGone?()
            }
            let reason = BrokenConnection.disguise(reason, violation)
            handler(reason)
            if violation == .invalidatesTwice { handler(reason) }
        }
    }

    func invalidate() { base.invalidate() }
}
