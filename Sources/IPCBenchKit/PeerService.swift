import Foundation
import IPCCore
import IPCFraming
import IPCPosix

/// What a peer process does. The benchmark and the tests start the `ipcbench` executable in
/// peer mode (`ipcbench peer ...`) so that every measurement and every peer-death test crosses a
/// real process boundary.
///
/// Requests are answered according to their msgid; one-way messages are echoed back as one-way
/// messages with the same msgid, which lets a test check delivery order end to end.
public enum PeerRequest {
    /// Reply with the request's payload.
    public static let echo: UInt32 = 1
    /// Never reply: the request stays pending until the peer dies or the requester times out.
    public static let stall: UInt32 = 2
    /// Fail the request (the requester gets a `.failure` reply).
    public static let fail: UInt32 = 3
}

public enum PeerRole: String, Sendable, CaseIterable {
    /// Listen on the endpoint and serve every client.
    case server
    /// Connect to the endpoint and serve that one connection.
    case client
}

/// Runs the peer side until the connection (client role) ends or standard input closes (the
/// parent went away), so an orphaned peer never lingers.
public struct PeerService: Sendable {
    public var transport: any MessageTransport
    public var endpoint: Endpoint
    public var role: PeerRole
    /// A burst to send as soon as a client is connected: one-way messages with msgids 0, 1, ...
    /// whose payload starts with the msgid (4 bytes, big-endian), padded to ``burstSize`` bytes.
    public var burstCount: Int
    public var burstSize: Int

    public init(transport: any MessageTransport, endpoint: Endpoint, role: PeerRole, burstCount: Int = 0, burstSize: Int = 4) {
        self.transport = transport
        self.endpoint = endpoint
        self.role = role
        self.burstCount = burstCount
        self.burstSize = burstSize
    }

    /// The payload of message `index` of a burst.
    public static func burstPayload(_ index: Int, size: Int) -> [UInt8] {
        var payload = withUnsafeBytes(of: UInt32(truncatingIfNeeded: index).bigEndian, Array.init)
        payload += [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: max(0, size - 4))
        return payload
    }

    static let handler: RequestHandler = { msgid, payload in
        switch msgid {
        case PeerRequest.stall:
            // Hold the request without answering; the reader thread parks here until the process dies.
            while true { sleep(3600) }
        case PeerRequest.fail:
            throw IPCError(code: .unsupportedOperation, message: "request failed on purpose")
        default:
            return payload
        }
    }

    public func run() async throws {
        // A test instrument: it accepts whatever size a test sends (1 GiB), so that limits are
        // exercised on the side under test.
        let options = ConnectionOptions.defaults {
            $0.requestHandler = Self.handler
            $0.maximumPayloadLength = 1 << 30
        }
        try await run(transport, options: options)
    }

    private func run<T: MessageTransport>(_ transport: T, options: ConnectionOptions) async throws {
        switch role {
        case .server:
            let listener = try transport.listen(at: endpoint, options: options, acceptFilter: nil)
            announceReady()
            let echoing = Task {
                await withTaskGroup(of: Void.self) { group in
                    for await connection in listener.connections {
                        group.addTask { await Self.echoMessages(on: connection) }
                    }
                }
            }
            await Self.waitForStandardInputToClose()
            listener.close()
            echoing.cancel()
        case .client:
            let connection = try transport.connect(to: endpoint, options: options)
            announceReady()
            for index in 0..<burstCount {
                try connection.send(Self.burstPayload(index, size: burstSize), msgid: UInt32(index), timeout: .seconds(60))
            }
            let stdinWatch = Task.detached {
                await Self.waitForStandardInputToClose()
                connection.invalidate()
            }
            await Self.echoMessages(on: connection)
            stdinWatch.cancel()
        }
    }

    private static func echoMessages(on connection: some MessageConnection) async {
        for await message in connection.messages {
            try? connection.send(message.payload, msgid: message.msgid, timeout: .seconds(5))
        }
    }

    private func announceReady() {
        FileHandle.standardOutput.write(Data("READY \(getpid())\n".utf8))
    }

    private static func waitForStandardInputToClose() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread {
                var byte: UInt8 = 0
                while read(STDIN_FILENO, &byte, 1) > 0 {}
                continuation.resume()
            }
        }
    }
}
