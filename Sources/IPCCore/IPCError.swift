/// The one error type that ipcbench's transports, framings and codecs throw.
///
/// Shaped like grpc-swift's `RuntimeError`: a ``Code`` that names what went wrong (a struct over a
/// private enum, so codes can be added without breaking anyone's `switch`), a human-readable
/// message, and an optional underlying cause (for example the `Errno` of a failed system call).
public struct IPCError: Error, Sendable, Hashable, CustomStringConvertible {
    public var code: Code
    public var message: String
    /// The lower-level error that caused this one, if any.
    public var cause: (any Error & Sendable)?

    public init(code: Code, message: String, cause: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.cause = cause
    }

    public var description: String {
        if let cause {
            return "\(code): \(message) (cause: \(cause))"
        }
        return "\(code): \(message)"
    }

    public static func == (lhs: IPCError, rhs: IPCError) -> Bool {
        lhs.code == rhs.code && lhs.message == rhs.message
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(code)
        hasher.combine(message)
    }
}

extension IPCError {
    /// What went wrong, independent of the message text.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Wrapped: String, Hashable, Sendable {
            // Framing
            case frameTooLarge, malformedFrame, truncatedFrame, unsupportedFraming
            // Secure decoding
            case disallowedType, malformedPayload, payloadTooLarge, nestingTooDeep
            // Endpoints and lifecycle
            case invalidEndpoint, nameOutsideGroup, endpointInUse, endpointNotFound, accessDenied
            case sendTimeout, receiveTimeout, invalidated, peerInvalidated
            case unsupportedOperation, transportFailure, receiveBufferFull
            // Services
            case interrupted
            // File coordination
            case coordinationTimeout, presenterFailed
        }

        private let wrapped: Wrapped
        private init(_ wrapped: Wrapped) { self.wrapped = wrapped }

        public var description: String { wrapped.rawValue }

        /// A frame header announced a payload longer than the decoder's configured maximum.
        /// Raised before any byte of that payload is buffered.
        public static var frameTooLarge: Code { .init(.frameTooLarge) }
        /// Bytes that are not a frame of the expected framing: bad magic, unknown version or kind,
        /// an HTTP start line or header that does not parse.
        public static var malformedFrame: Code { .init(.malformedFrame) }
        /// The stream ended in the middle of a frame.
        public static var truncatedFrame: Code { .init(.truncatedFrame) }
        /// A valid message that uses a feature this framing refuses (for example HTTP chunked encoding).
        public static var unsupportedFraming: Code { .init(.unsupportedFraming) }

        /// A payload names a type the receiver did not allow.
        public static var disallowedType: Code { .init(.disallowedType) }
        /// A payload that its codec cannot decode.
        public static var malformedPayload: Code { .init(.malformedPayload) }
        /// A payload above the receiver's size limit.
        public static var payloadTooLarge: Code { .init(.payloadTooLarge) }
        /// A payload nested deeper than the receiver's limit.
        public static var nestingTooDeep: Code { .init(.nestingTooDeep) }

        /// An endpoint name or group directory that cannot be used.
        public static var invalidEndpoint: Code { .init(.invalidEndpoint) }
        /// A name that must begin with the group identifier and a period does not (the
        /// counterpart of Mach's `BOOTSTRAP_NOT_PRIVILEGED` for app-group service names).
        public static var nameOutsideGroup: Code { .init(.nameOutsideGroup) }
        /// Another live process already listens on this endpoint.
        public static var endpointInUse: Code { .init(.endpointInUse) }
        /// Nobody listens on this endpoint.
        public static var endpointNotFound: Code { .init(.endpointNotFound) }
        /// The peer was refused (by an accept filter, or by file permissions).
        public static var accessDenied: Code { .init(.accessDenied) }
        /// The message could not be handed to the kernel before the send timeout.
        public static var sendTimeout: Code { .init(.sendTimeout) }
        /// No reply arrived before the receive timeout; the connection is still valid.
        public static var receiveTimeout: Code { .init(.receiveTimeout) }
        /// The connection was already invalid when the operation was called.
        public static var invalidated: Code { .init(.invalidated) }
        /// The connection became invalid (for example the peer died) while the operation waited.
        public static var peerInvalidated: Code { .init(.peerInvalidated) }
        /// The transport does not offer this operation (see ``TransportCapabilities``).
        public static var unsupportedOperation: Code { .init(.unsupportedOperation) }
        /// A system call or other transport-level failure; ``IPCError/cause`` holds the detail.
        public static var transportFailure: Code { .init(.transportFailure) }
        /// The application left more received messages untaken than
        /// ``ConnectionOptions/messageBufferLimit`` allows, on a connection whose receive path
        /// cannot wait for it (it serves other connections too); the connection is invalidated.
        public static var receiveBufferFull: Code { .init(.receiveBufferFull) }

        /// The service a ``ServiceConnection`` talks to went away (its process died or ended the
        /// connection) while the operation waited. Unlike ``peerInvalidated`` this is not final:
        /// the next operation connects to the service again (XPC's
        /// `XPC_ERROR_CONNECTION_INTERRUPTED`).
        public static var interrupted: Code { .init(.interrupted) }

        /// A coordinated read or write of a file could not take the file's lock before its
        /// timeout, because another reader or writer (in this or another process) held it.
        public static var coordinationTimeout: Code { .init(.coordinationTimeout) }

        /// A presenter of the file refused a coordinated access: its save failed, or it
        /// answered something that is not an answer.
        public static var presenterFailed: Code { .init(.presenterFailed) }
    }
}

extension IPCError {
    /// The error of a connection invalidated because its application did not take its messages.
    public static var receiveBufferFull: IPCError {
        IPCError(code: .receiveBufferFull, message: "the application left more messages untaken than the connection's messageBufferLimit allows, and this receive path serves other connections too")
    }
}

extension IPCError {
    /// The ``IPCError/cause`` of an ``Code/endpointNotFound`` from an endpoint whose listener
    /// runs but did not take this client: the service is there; its client should try again
    /// later, and not start another copy of it. Either the listener said so (``answered``): it
    /// is full (its ``ConnectionOptions/maximumConnections``; on a transport whose listener
    /// answers a connect, also too many clients in the middle of connecting or waiting for its
    /// accept filter). Or it did not answer the connect within the transport's connect timeout
    /// while its process held the endpoint: flooded with clients, hung, or stopped.
    /// Make such an error with ``listenerBusy(_:answered:)``; ask for it with ``isListenerBusy``.
    public struct ListenerBusy: Error, Sendable, Hashable, CustomStringConvertible {
        /// Whether the listener answered the connect (it is full). `false`: it holds the
        /// endpoint but did not answer in time.
        public var answered: Bool
        public init(answered: Bool = true) { self.answered = answered }
        public var description: String { answered ? "the listener is busy" : "the listener runs but did not answer in time" }
    }

    /// A busy listener's answer: ``Code/endpointNotFound`` (try again later) with
    /// ``ListenerBusy`` as its cause, so that a client can tell it from nobody listening. A
    /// transport reports every busy refusal this way (`answered`), and a connect that a listener
    /// holding the endpoint did not answer in time (`answered: false`). A ``ServiceConnection``
    /// that starts its service on demand does not start it for either.
    public static func listenerBusy(_ message: String, answered: Bool = true) -> IPCError {
        IPCError(code: .endpointNotFound, message: message, cause: ListenerBusy(answered: answered))
    }

    /// Whether this is a busy listener's answer (``listenerBusy(_:answered:)``): the endpoint
    /// has a listener, which did not take this client for now. `false` for nobody listening,
    /// and for every other code. Looks through causes that are themselves `IPCError`s.
    public var isListenerBusy: Bool { listenerBusyCause != nil }

    /// The ``ListenerBusy`` cause of a busy listener's answer, if this is one.
    public var listenerBusyCause: ListenerBusy? {
        var error: IPCError? = self
        while let current = error, current.code == .endpointNotFound {
            if let busy = current.cause as? ListenerBusy { return busy }
            error = current.cause as? IPCError
        }
        return nil
    }
}
