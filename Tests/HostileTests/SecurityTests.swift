import FilePresenterTransport
import CIPCShims
import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCSystem
import IPCTestSupport
@testable import MessagePortTransport
import NotifyTransport
import Testing
import UnixSocketTransport
import IPCEngine
import IPCFraming
import SystemPackage

/// Endpoints, queues and shared files are owner-only inside a group directory that is not
/// world-writable, whatever the umask of the processes that create them.
@Suite("Security", .serialized, .usesMessageQueues)
struct SecurityTests {
    static let transports = TransportCatalog.names

    private func mode(_ path: String) throws -> mode_t {
        var status = stat()
        guard lstat(path, &status) == 0 else { throw IPCError(code: .endpointNotFound, message: "no \(path)") }
        return status.st_mode & 0o7777
    }

    private func endpoint(_ group: borrowing TestGroup, _ transport: String) throws -> Endpoint {
        transport == "message-port" ? try group.scopedEndpoint("private") : try group.endpoint("private")
    }

    @Test("every file and queue a listener and a client create is mode 0600, and a group directory they create is 0700, even with umask 0", arguments: transports)
    func ownerOnlyModes(_ transport: String) async throws {
        let parent = try TestGroup()
        // A group directory that does not exist yet: the listener process creates it.
        let group = try TestGroup()
        let directory = GroupDirectory(path: parent.directory.path + "/" + group.directory.identifier)
        let endpoint = transport == "message-port"
            ? try Endpoint(group: directory, name: directory.identifier + ".private") : try Endpoint(group: directory, name: "private")
        let umask = ["--umask", "0"]
        let common = ["peer", "--transport", transport, "--group", directory.path, "--endpoint", endpoint.name]
        let server = try await runBlocking { try PeerProcess(arguments: common + ["--role", "server"] + umask) }
        defer { server.stop() }
        let client = try await runBlocking { try PeerProcess(arguments: common + ["--role", "client"] + umask) }
        defer {
            client.stop()
            if transport == "message-port" { MessageQueue.unlink(name: PortNames.replyQueue(endpoint, pid: client.pid, serial: 1)) }
        }
        // The client is connected (READY), so everything both sides create exists now.
        #expect(try mode(directory.path) == 0o700)
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(files.contains(endpoint.name + ".lock"))
        #expect(files.count >= (transport == "message-port" ? 1 : 2), "only \(files) in the group directory")
        for file in files {
            let fileMode = try mode(directory.path + "/" + file)
            #expect(fileMode == 0o600, "\(file) is mode \(String(fileMode, radix: 8))")
        }
        if transport == "message-port" {
            // Both queues are made by `MessageQueue.create`; a connected client's reply queue has
            // no name any more (nobody can open it), so the server's is the one to look at.
            let name = PortNames.serverQueue(endpoint)
            let queue = try MessageQueue.open(name: name, forWriting: true)
            defer { queue.close() }
            var status = stat()
            #expect(fstat(queue.descriptor.rawValue, &status) == 0)
            #expect(status.st_mode & 0o7777 == 0o600, "queue \(name) is mode \(String(status.st_mode & 0o7777, radix: 8))")
            #expect(!MessageQueue.exists(name: PortNames.replyQueue(endpoint, pid: client.pid, serial: 1)))
        }
    }

    @Test("a group directory every user can write to is refused, even with the sticky bit; so is one owned by another user", arguments: transports)
    func unsafeGroupDirectoriesAreRefused(_ transport: String) async throws {
        let chosen = try TransportCatalog.transport(named: transport, framing: .binary)
        for (what, setUp) in [
            ("world-writable", { (path: String) in chmod(path, 0o777) }),
            ("world-writable and sticky", { (path: String) in chmod(path, 0o1777) }),
            ("group-writable", { (path: String) in chmod(path, 0o770) }),
            ("owned by another user", { (path: String) in chown(path, 65534, 65534) }),
        ] {
            let group = try TestGroup()
            #expect(setUp(group.directory.path) == 0, "could not make the directory \(what)")
            let endpoint = try endpoint(group, transport)
            do {
                let listener = try chosen.listen(at: endpoint, options: .defaults, acceptFilter: nil)
                listener.close()
                Issue.record("a \(what) group directory was accepted by \(transport)")
            } catch let error as IPCError {
                #expect(error.code == .invalidEndpoint, "\(what): \(error)")
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: group.directory.path).isEmpty, "\(what): files were created")
        }
    }

    @Test("a client refuses to connect through a group directory that became group-writable or another user's, with a listener there", arguments: transports)
    func clientsCheckTheGroupDirectory(_ transport: String) async throws {
        let chosen = try TransportCatalog.transport(named: transport, framing: .binary)
        for (what, setUp, restore) in [
            ("group-writable", { (path: String) in chmod(path, 0o770) }, { (path: String) in chmod(path, 0o700) }),
            ("owned by another user", { (path: String) in chown(path, 65534, 65534) }, { (path: String) in chown(path, geteuid(), getegid()) }),
        ] {
            let group = try TestGroup()
            let endpoint = try endpoint(group, transport)
            // A live listener, as an attacker who controls the directory could have put there.
            let listener = try chosen.listen(at: endpoint, options: .defaults, acceptFilter: nil)
            defer { listener.close() }
            #expect(setUp(group.directory.path) == 0, "could not make the directory \(what)")
            await expectIPCError(.invalidEndpoint) { try chosen.connect(to: endpoint, options: .defaults).invalidate() }
            #expect(restore(group.directory.path) == 0)
            // Where the directory is safe, the same client connects.
            let connection = try await chosen.connect(to: endpoint, options: .defaults)
            connection.invalidate()
        }
    }

    @Test("a message queue name another user took first is reported as accessDenied, naming the cause, never endpointInUse",
          .enabled(if: geteuid() == 0, "needs root to run the two users"))
    func squattedQueueName() async throws {
        // Two throw-away users (numeric ids need no account): the owner of the group directory,
        // and a squatter who creates the queue name first.
        let (owner, squatter): (uid_t, uid_t) = (61_001, 61_002)
        let parent = try TestGroup()
        chmod(parent.directory.path, 0o755)
        let directory = GroupDirectory(path: parent.directory.path + "/owned")
        #expect(mkdir(directory.path, 0o700) == 0 && chown(directory.path, owner, owner) == 0)
        let endpoint = try Endpoint(group: directory, name: "owned.port")
        let queue = PortNames.serverQueue(endpoint)
        defer { MessageQueue.unlink(name: queue) }
        let executable = try PeerProcess.executableURL().path
        func run(as uid: uid_t, _ arguments: [String]) throws -> (status: Int32, output: String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid", "\(uid)", "--regid", "\(uid)", "--clear-groups", executable] + arguments
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            process.standardInput = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: data, as: UTF8.self))
        }
        let squat = try run(as: squatter, ["hostile", "queue", "--name", queue, "--create"])
        #expect(squat.status == 0, "the squatter could not create \(queue): \(squat.output)")
        let server = try run(as: owner, ["peer", "--transport", "message-port", "--group", directory.path, "--endpoint", endpoint.name, "--role", "server"])
        #expect(server.status != 0)
        #expect(server.output.contains("accessDenied") && server.output.contains("another user"), "the listener said: \(server.output)")
        #expect(!server.output.contains("endpointInUse"), "the listener said: \(server.output)")
    }

    /// Another user's listener: binds `socket`, accepts every client and appends what each sends
    /// to `log` (both in a directory of that user's).
    static let foreignListener = """
    import os, socket, sys, threading
    path, log = sys.argv[1], sys.argv[2]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    open(log, "wb").close()
    def drain(client):
        while True:
            data = client.recv(4096)
            if not data:
                return
            with open(log, "ab") as f:
                f.write(data)
    while True:
        client, _ = server.accept()
        threading.Thread(target=drain, args=(client,), daemon=True).start()
    """

    @Test("a client whose checked group directory leads, by the time it connects, to another user's socket refuses that listener and sends it nothing",
          .enabled(if: geteuid() == 0, "needs root to run the second user"), arguments: ["unix-socket", "notify", "file-presenter"])
    func swappedPathReachesNoForeignListener(_ transport: String) async throws {
        let attacker: uid_t = 61_003
        let parent = try TestGroup()
        chmod(parent.directory.path, 0o755)
        // The attacker's own directory, where it binds its socket.
        let evil = parent.directory.path + "/evil"
        #expect(mkdir(evil, 0o700) == 0 && chown(evil, attacker, attacker) == 0)
        let group = try TestGroup()
        let endpoint = try group.endpoint("victim")
        let socketPath = transport == "unix-socket" ? UnixSocketTransport.socketPath(endpoint) : endpoint.path(suffix: ".rendezvous")
        let bound = evil + "/listening.sock"
        let log = evil + "/received"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--reuid", "\(attacker)", "--regid", "\(attacker)", "--clear-groups", "/usr/bin/python3", "-c", Self.foreignListener, bound, log]
        process.standardInput = FileHandle.nullDevice
        _ = try ChildProcess.run(process)
        // Killed, not waited for (an async function, on the cooperative pool); Foundation reaps it.
        defer { _ = Foundation.kill(process.processIdentifier, SIGKILL) }
        let deadline = ContinuousClock.now + .seconds(30)
        while !FileManager.default.fileExists(atPath: log), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        try #require(FileManager.default.fileExists(atPath: log), "the foreign listener did not start")
        // The victim's path now leads to the attacker's socket, as a swapped directory makes it
        // between the client's check and its connect (moving a bound socket's name keeps it bound).
        #expect(rename(bound, socketPath) == 0)
        let chosen = try TransportCatalog.transport(named: transport, framing: .binary)
        await #expect(throws: IPCError.self) {
            do {
                let connection = try await chosen.connect(to: endpoint, options: .defaults)
                defer { connection.invalidate() }
                _ = try await connection.request(Array("secret".utf8), msgid: PeerRequest.echo, sendTimeout: .seconds(2), receiveTimeout: .seconds(2))
            } catch let error as IPCError {
                #expect(error.code == .accessDenied, "\(transport): \(error)")
                #expect(error.message.contains("user \(attacker)"), "\(transport): \(error)")
                throw error
            }
        }
        try await Task.sleep(for: .milliseconds(300))
        let received = try Data(contentsOf: URL(fileURLWithPath: log))
        #expect(received.isEmpty, "\(transport): the foreign listener received \(received.count) bytes from the client")
    }

    @Test("a listener's pid comes from the kernel's lock table, not the lock file's text: overwriting it refuses nobody and misleads nobody", arguments: ["message-port", "file-presenter"])
    func forgedLockFilePID(_ transport: String) async throws {
        let group = try TestGroup()
        let endpoint = try endpoint(group, transport)
        let server = try await runBlocking { try PeerProcess(transport: transport, framing: .binary, endpoint: endpoint, role: .server) }
        defer { server.stop() }
        let chosen = try TransportCatalog.transport(named: transport, framing: .binary)
        for forged in ["1", "not a pid", String(Int32.max), ""] {
            // Another process of this user rewrites the text (pid 1 is alive, the others are not).
            try Data(forged.utf8).write(to: URL(fileURLWithPath: endpoint.path(suffix: ".lock")))
            let connection = try await chosen.connect(to: endpoint, options: .defaults)
            defer { connection.invalidate() }
            #expect(connection.peer?.pid == server.pid, "with \(forged.debugDescription) in the lock file")
            #expect(try await connection.request([3], msgid: PeerRequest.echo, sendTimeout: .seconds(10), receiveTimeout: .seconds(30)) == [3])
        }
    }

    @Test("the accept filter sees the connecting process's kernel-verified credentials, whatever it claims")
    func acceptFilterSeesKernelCredentials() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("filtered")
        let seen = LockedValue<[PeerCredentials]>([])
        let listener = try UnixSocketTransport().listen(at: endpoint, options: .defaults) { credentials in
            seen.set(seen.get() + [credentials])
            return false
        }
        defer { listener.close() }
        // A raw client process: it says nothing about itself, and is refused (dropped at once).
        let refused = try await HostilePeer.socket(path: endpoint.path(suffix: ".sock"), bytes: Array("I am pid 1, uid 0".utf8))
        try await expectDropped(refused, "the refused client")
        let credentials = try #require(seen.get().first)
        #expect(credentials.pid == refused.pid)
        #expect(credentials.uid == geteuid())
        #expect(credentials.gid == getegid())
        #expect(listener.activeConnections.isEmpty)
    }
}
