import FilePresenterTransport
import Foundation
import IPCBenchKit
import IPCConformance
import IPCCore
import IPCTestSupport
import NotifyTransport
import Testing
import UnixSocketTransport

/// Socket activation with the real launcher, `systemd-socket-activate` (Debian's `systemd`
/// package; systemd itself need not run): it listens on the endpoint's socket, and on the first
/// connection execs `ipcbench peer --socket-activated`, which serves on the socket it was handed
/// and exits when idle. A shell loop starts the launcher again after each exit, as systemd would
/// start the service again (systemd-socket-activate execs, so it cannot).
@Suite("Socket activation: started on the first connection, exits when idle, loses nothing", .serialized, .elasticThreads)
struct SocketActivationTests {
    static let launcher = "/usr/bin/systemd-socket-activate"

    static func transports() -> [(name: String, transport: any SocketActivatedTransport)] {
        [("unix-socket", UnixSocketTransport()), ("notify", NotifyTransport()), ("file-presenter", FilePresenterTransport())]
    }

    @Test("the first request starts the service, later ones reuse it, an idle service exits and the next request starts it again; clients racing the idle exits all get answers", arguments: ["unix-socket", "notify", "file-presenter"])
    func activation(transportName: String) async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.launcher), "\(Self.launcher) is missing: Scripts/install-system-packages.sh installs Debian's systemd package")
        let transport = try #require(Self.transports().first { $0.name == transportName }?.transport)
        let lost = try await run(transport, named: transportName, handOver: .refuseNewConnections)
        #expect(lost.isEmpty, "requests lost in the hand-over: \(lost)")
    }

    @Test("a hand-over that is not this process's, or not the endpoint's socket, is refused with a clear error")
    func refusesAWrongHandOver() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.launcher), "\(Self.launcher) is missing: Scripts/install-system-packages.sh installs Debian's systemd package")
        let group = try TestGroup()
        let directory = group.directory.path
        let executable = try PeerProcess.executableURL().path
        let peer = "\"$IPCBENCH\" peer --transport unix-socket --group \"$GROUP\" --endpoint svc --socket-activated"
        // `exec` keeps the shell's pid, so `$$` is the peer's.
        let cases: [(setup: String, expected: String)] = [
            ("LISTEN_PID=$$ LISTEN_FDS=1 exec \(peer) 3</etc/hostname", "3: not a socket"),
            ("LISTEN_PID=1 LISTEN_FDS=1 exec \(peer) 3</etc/hostname", "not this process"),
            ("LISTEN_PID=$$ LISTEN_FDS=many exec \(peer)", "LISTEN_FDS must be"),
            ("LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=a:b exec \(peer) 3</etc/hostname", "LISTEN_FDNAMES names 2"),
            ("exec \(peer)", "LISTEN_FDS is not set"),
            // A real launcher's socket, bound somewhere else.
            ("\"$LAUNCHER\" -l \"$GROUP/other.sock\" \(peer) & launcher=$!; sleep 0.3; python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' \"$GROUP/other.sock\"; wait $launcher", "bound to \(directory)/other.sock"),
        ]
        for (setup, expected) in cases {
            let shell = Process()
            shell.executableURL = URL(fileURLWithPath: "/bin/sh")
            shell.arguments = ["-c", setup]
            shell.environment = ["IPCBENCH": executable, "GROUP": directory, "LAUNCHER": Self.launcher, "PATH": "/usr/bin:/bin"]
            let errors = Pipe()
            shell.standardError = errors
            shell.standardOutput = FileHandle.nullDevice
            _ = try ChildProcess.run(shell)
            let output = try await runBlocking { () -> String in
                let data = errors.fileHandleForReading.readDataToEndOfFile()
                shell.waitUntilExit()
                return String(decoding: data, as: UTF8.self)
            }
            #expect(shell.terminationReason == .exit && shell.terminationStatus != 0, "\(setup): exited \(shell.terminationStatus) (\(shell.terminationReason))")
            #expect(output.contains(expected), "\(setup): expected \(expected.debugDescription) in \(output.debugDescription)")
        }
    }

    /// Runs the launcher loop and the clients; returns the errors of requests that failed.
    private func run<T: SocketActivatedTransport>(_ transport: T, named name: String, handOver: IdleHandOver) async throws -> [String] {
        let group = try TestGroup()
        let endpoint = try group.endpoint("activated")
        let socketPath = transport.activationSocketPath(for: endpoint)
        let directory = group.directory.path
        let starts = directory + "/starts.log"
        let exits = directory + "/exits.log"
        let stop = directory + "/stop"
        let executable = try PeerProcess.executableURL().path
        // What `ipcbench peer --print-activation-socket` prints is the path the transport uses.
        let (status, printed) = try await PeerProcess.runToCompletion(["peer", "--transport", name, "--group", directory, "--endpoint", endpoint.name, "--print-activation-socket"])
        #expect(status == 0)
        #expect(printed.trimmingCharacters(in: .whitespacesAndNewlines) == socketPath)

        let idle = 0.4
        let script = """
        while [ ! -e "$STOP" ]; do
            "$LAUNCHER" -l "$SOCKET" "$IPCBENCH" peer --transport "$TRANSPORT" --group "$GROUP" --endpoint "$ENDPOINT" \
                --socket-activated --exit-when-idle \(idle) --idle-hand-over \(handOver.rawValue) >> "$STARTS" 2>> "$STARTS.err"
            echo "exit $?" >> "$EXITS"
        done
        """
        let loop = Process()
        loop.executableURL = URL(fileURLWithPath: "/bin/sh")
        loop.arguments = ["-c", script]
        loop.environment = [
            "STOP": stop, "LAUNCHER": Self.launcher, "SOCKET": socketPath, "IPCBENCH": executable, "TRANSPORT": name,
            "GROUP": directory, "ENDPOINT": endpoint.name, "STARTS": starts, "EXITS": exits, "PATH": "/usr/bin:/bin",
        ]
        _ = try ChildProcess.run(loop)
        defer {
            _ = FileManager.default.createFile(atPath: stop, contents: nil)
            _ = Foundation.kill(loop.processIdentifier, SIGKILL)
            // The launcher or service of the last round: the one process holding the socket.
            _ = try? Process.run(URL(fileURLWithPath: "/usr/bin/pkill"), arguments: ["-KILL", "-f", "--", "--group \(directory) "])
        }
        @Sendable func startCount() -> Int { lines(starts).filter { $0.hasPrefix("READY") }.count }
        func diagnostics() -> String {
            "starts: \(lines(starts)); exits: \(lines(exits)); stderr: \(lines(starts + ".err").suffix(10))"
        }

        let listening = await poll(seconds: 30) { FileManager.default.fileExists(atPath: socketPath) }
        try #require(listening, "the launcher did not listen within 30 s: \(diagnostics())")
        // Listening is the launcher's: nothing has started the service yet.
        try await Task.sleep(for: .milliseconds(300))
        #expect(startCount() == 0, "the service started before any client: \(diagnostics())")

        let options = ConnectionOptions.defaults
        let retry = ConnectRetry(for: .seconds(60))
        @Sendable func echo(_ index: Int) async throws {
            let connection = try await transport.connect(to: endpoint, options: options, retrying: retry)
            defer { connection.invalidate() }
            let payload = Array("request \(index)".utf8)
            let reply = try await connection.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30))
            #expect(reply == payload, "request \(index): the reply differs")
        }

        // The first client starts it; clients while it runs reuse it. The service writes its
        // READY line once it listens, and may answer the first request before that write lands:
        // the log is looked at until the line is there.
        try await echo(0)
        _ = await poll(seconds: 10) { startCount() >= 1 }
        #expect(startCount() == 1, "\(diagnostics())")
        let connection = try await transport.connect(to: endpoint, options: options, retrying: retry)
        for index in 1...5 {
            let payload = [UInt8(index)]
            #expect(try await connection.request(payload, msgid: ConformancePeer.Request.echo, sendTimeout: .seconds(30), receiveTimeout: .seconds(30)) == payload)
        }
        // An open connection keeps it from being idle, however long.
        try await Task.sleep(for: .seconds(idle * 3))
        #expect(lines(exits).isEmpty, "the service exited while a connection was open: \(diagnostics())")
        #expect(startCount() == 1, "\(diagnostics())")
        connection.invalidate()

        // Idle: it exits; the next client starts it again.
        let exited = await poll(seconds: 30) { lines(exits).count >= 1 }
        try #require(exited, "the idle service did not exit within 30 s: \(diagnostics())")
        #expect(lines(exits).first == "exit 0", "\(diagnostics())")
        try await echo(100)
        _ = await poll(seconds: 10) { startCount() >= 2 }
        #expect(startCount() == 2, "\(diagnostics())")

        // Clients arriving around the idle exits: every one is answered (a connect refused while
        // the service exits, or before the launcher listens again, is retried).
        var lost: [String] = []
        let racing = 16
        for index in 0..<racing {
            try await Task.sleep(for: .milliseconds(Int64(idle * 1000 * (0.8 + Double(index % 8) * 0.1))))
            do {
                try await echo(1000 + index)
            } catch {
                lost.append("request \(1000 + index): \(error)")
            }
        }
        #expect(startCount() >= 3, "no idle exit happened between the racing clients: \(diagnostics())")
        #expect(lines(exits).allSatisfy { $0 == "exit 0" }, "\(diagnostics())")
        print("socket activation (\(name), \(handOver.rawValue)): \(startCount()) starts, \(lines(exits).count) idle exits, \(racing - lost.count) of \(racing) racing requests answered")
        return lost
    }
}

/// The lines of a log file the launcher loop appends to (none if it does not exist yet).
private func lines(_ path: String) -> [String] {
    ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
}
