import IPCCore

/// A transport with its associated types erased, so that cases are plain functions rather than
/// generic ones and the catalog can be listed without a transport.
struct ErasedTransport: Sendable {
    let name: String
    let capabilities: TransportCapabilities
    let listen: @Sendable (Endpoint, ConnectionOptions, AcceptFilter?) throws -> ErasedListener
    let connect: @Sendable (Endpoint, ConnectionOptions) throws -> any MessageConnection
    /// The transport's `async` connect, which holds no cooperative thread while it waits.
    let connectSuspending: @Sendable (Endpoint, ConnectionOptions) async throws -> any MessageConnection

    init<Transport: MessageTransport>(_ transport: Transport) {
        name = transport.name
        capabilities = transport.capabilities
        listen = { endpoint, options, acceptFilter in
            ErasedListener(try transport.listen(at: endpoint, options: options, acceptFilter: acceptFilter))
        }
        connect = { endpoint, options in
            try transport.connect(to: endpoint, options: options)
        }
        connectSuspending = { endpoint, options in
            try await transport.connect(to: endpoint, options: options)
        }
    }
}

/// A listener with its connection type erased.
struct ErasedListener: Sendable {
    let endpoint: Endpoint
    let connections: AsyncStream<any MessageConnection>
    let activeConnections: @Sendable () -> [any MessageConnection]
    let broadcast: @Sendable (_ payload: [UInt8], _ msgid: UInt32, _ timeout: Duration) -> Int
    let close: @Sendable () -> Void

    init<Listener: MessageListener>(_ listener: Listener) {
        endpoint = listener.endpoint
        connections = AsyncStream { continuation in
            let forwarding = Task {
                for await connection in listener.connections {
                    continuation.yield(connection)
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in forwarding.cancel() }
        }
        activeConnections = { listener.activeConnections }
        broadcast = { payload, msgid, timeout in listener.broadcast(payload, msgid: msgid, timeout: timeout) }
        close = { listener.close() }
    }
}
