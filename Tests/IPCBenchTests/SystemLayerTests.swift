import Foundation
import Glibc
import IPCCore
import IPCSystem
import IPCTestSupport
import SystemPackage
import Testing

/// IPCSystem's public surface in process: swift-system `FileDescriptor`s in and out, `Duration`
/// timeouts, errors as `IPCError` with the `Errno` as cause.
@Suite("IPCSystem: typed descriptors and Duration timeouts")
struct SystemLayerTests {
    @Test("a socket listened on, connected to and accepted is a FileDescriptor; the credentials are this process's")
    func socketRoundTrip() throws {
        let group = try TestGroup()
        let path = group.directory.path + "/typed.sock"
        let listener = try UnixSocket.listen(path: path)
        defer { try? listener.close() }
        guard case .none = try UnixSocket.acceptIfReady(listener) else {
            Issue.record("a connection was waiting before any connected")
            return
        }
        let client = try UnixSocket.connect(path: path)
        defer { try? client.close() }
        guard case .accepted(let server) = try UnixSocket.acceptIfReady(listener) else {
            Issue.record("the connection was not accepted")
            return
        }
        defer { try? server.close() }
        #expect(try UnixSocket.peerCredentials(server).pid == getpid())
        var written = 0
        let bytes: [UInt8] = [1, 2, 3]
        try bytes.withUnsafeBytes { try UnixSocket.sendAll(client, header: $0, payload: UnsafeRawBufferPointer(start: nil, count: 0), deadline: .now + .seconds(5), written: &written) }
        #expect(written == 3)
        var received = [UInt8](repeating: 0, count: 8)
        let count = try received.withUnsafeMutableBytes { try UnixSocket.read(server, into: $0) }
        #expect(Array(received.prefix(count)) == bytes)
        #expect(try received.withUnsafeMutableBytes { try UnixSocket.readIfReady(server, into: $0) } == nil)
        UnixSocket.shutdown(client)
        #expect(try received.withUnsafeMutableBytes { try UnixSocket.readIfReady(server, into: $0) } == 0)
    }

    @Test("a path nobody listens on throws endpointNotFound with the Errno as cause")
    func connectToNobody() throws {
        let group = try TestGroup()
        do {
            _ = try UnixSocket.connect(path: group.directory.path + "/nobody.sock")
            Issue.record("the connect succeeded")
        } catch let error as IPCError {
            #expect(error.code == .endpointNotFound && error.cause as? Errno == .noSuchFileOrDirectory)
        }
    }

    @Test("a launcher's hand-over names its descriptors from 3 on, in order")
    func handoverDescriptors() throws {
        let handover = try SocketActivation.handover(environment: ["LISTEN_PID": "42", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"], pid: 42)
        #expect(handover?.descriptors.map(\.rawValue) == [3, 4])
        #expect(handover?.descriptors.first == SocketActivation.firstDescriptor)
        #expect(handover?.names == ["a", "b"])
        #expect(try SocketActivation.handover(environment: [:], pid: 42) == nil)
    }

    @Test("a futex counter's wait ends at its Duration timeout, and at once for a count already changed")
    func futexTimeout() {
        let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
        defer { word.deallocate() }
        word.initialize(to: 0)
        let counter = FutexCounter(address: word)
        let start = ContinuousClock.now
        #expect(counter.wait(whileEqualTo: 0, timeout: .milliseconds(20)) == 0)
        #expect(ContinuousClock.now - start >= .milliseconds(15))
        #expect(counter.wait(whileEqualTo: 0, timeout: .zero) == 0)
        counter.post()
        // No timeout: returns because the count is not the one seen.
        #expect(counter.wait(whileEqualTo: 0) == 1)
    }

    @Test("a Duration becomes whole nanoseconds clamped at zero and at about 285 years, never wrapped to a short wait")
    func wholeNanoseconds() {
        #expect(Duration.milliseconds(1500).wholeNanoseconds == 1_500_000_000)
        #expect(Duration.seconds(-5).wholeNanoseconds == 0)
        let longest = Duration.seconds(Int64.max).wholeNanoseconds
        #expect(longest >= Duration.seconds(8_000_000_000).wholeNanoseconds)
        // Room for a deadline: the monotonic clock's now plus the longest does not wrap.
        #expect(longest <= UInt64.max / 2)
    }

    @Test("a queue's deadline is made from a Duration: a receive gives up at it, a send into a full queue throws sendTimeout", .usesMessageQueues)
    func queueDeadline() throws {
        let name = "/ipcb.typed-deadline-\(getpid())"
        MessageQueue.unlink(name: name)
        let reader = try MessageQueue.create(name: name, maximumMessages: 1, messageSize: 64)
        defer {
            reader.close()
            MessageQueue.unlink(name: name)
        }
        let writer = try MessageQueue.open(name: name, forWriting: true)
        defer { writer.close() }
        var buffer = [UInt8](repeating: 0, count: 64)
        let start = ContinuousClock.now
        #expect(try buffer.withUnsafeMutableBytes { try reader.receive(into: $0, deadline: .after(.milliseconds(20))) } == nil)
        #expect(ContinuousClock.now - start >= .milliseconds(15))
        let message: [UInt8] = [7]
        try message.withUnsafeBytes { try writer.send($0, deadline: .after(.seconds(5))) }
        do {
            try message.withUnsafeBytes { try writer.send($0, deadline: .after(.zero)) }
            Issue.record("a send into a full queue succeeded")
        } catch let error as IPCError {
            #expect(error.code == .sendTimeout)
        }
        #expect(try buffer.withUnsafeMutableBytes { try reader.receive(into: $0, deadline: .after(.seconds(5))) } == 1)
        #expect(buffer[0] == 7)
        // A timeout past what a timespec holds is a deadline that never comes, not an overflow.
        try message.withUnsafeBytes { try writer.send($0, deadline: .after(.seconds(Int64.max))) }
        #expect(try buffer.withUnsafeMutableBytes { try reader.receive(into: $0, deadline: .after(.seconds(Int64.max))) } == 1)
    }
}
