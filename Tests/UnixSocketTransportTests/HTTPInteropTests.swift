import Foundation
import IPCConformance
import IPCBenchKit
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// A stock HTTP client talks to the echo service over the HTTP framing.
@Suite("Unix socket: HTTP framing with curl")
struct HTTPInteropTests {
    @Test("curl --unix-socket POSTs a body and reads it back")
    func curlEcho() async throws {
        let group = try TestGroup()
        let endpoint = try group.endpoint("http-echo")
        let peer = try await runBlocking { try PeerProcess(transport: "unix-socket", framing: .http, endpoint: endpoint, role: .server) }
        defer { peer.stop() }
        for body in ["hello", String(repeating: "0123456789", count: 500)] {
            let curl = Process()
            curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            curl.arguments = ["--silent", "--show-error", "--fail", "--max-time", "20", "-H", "Expect:", "--unix-socket", endpoint.path(suffix: ".sock"), "--data-binary", body, "http://localhost/echo"]
            let output = try ChildProcess.run(curl, output: true).output!
            let data = output.readDataToEndOfFile()
            curl.waitUntilExit()
            #expect(curl.terminationStatus == 0)
            #expect(String(decoding: data, as: UTF8.self) == body)
        }
    }
}
