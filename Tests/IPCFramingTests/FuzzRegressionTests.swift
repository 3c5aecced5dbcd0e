import Foundation
import IPCCore
import IPCFraming
import IPCTestSupport
import Testing

/// Replays the framing fixtures through the same reassemblers as the fuzz targets: each stream must
/// give valid frames and then at most one typed error, the same whether it arrives whole, one byte
/// at a time or in 7-byte chunks.
@Suite(.offTheCooperativePool) struct FuzzRegressionTests {
    /// The fuzz targets' maximum, so that the fixtures' lengths are judged as they were found.
    static let maximumPayloadLength = 512

    static let binary = FuzzFixture.all(in: "binary")
    static let http = FuzzFixture.all(in: "http")

    struct Outcome: Equatable, CustomStringConvertible {
        var frames: [Frame]
        var code: IPCError.Code?
        var description: String { "\(frames.count) frames, then \(code.map { "\($0)" } ?? "a clean end")" }
    }

    @Test func fixturesArePresent() {
        #expect(Self.binary.count >= 10, "binary fixtures under \(FuzzFixture.root.path)")
        #expect(Self.http.count >= 20, "HTTP fixtures under \(FuzzFixture.root.path)")
    }

    @Test(arguments: binary)
    func binaryFixture(_ fixture: FuzzFixture) throws {
        try replay(fixture, framing: .binary)
    }

    @Test(arguments: http)
    func httpFixture(_ fixture: FuzzFixture) throws {
        try replay(fixture, framing: .http)
    }

    private func replay(_ fixture: FuzzFixture, framing: Framing) throws {
        let whole = try decodeWhole(fixture.bytes, framing: framing)
        let byteByByte = try decodeByteByByte(fixture.bytes, framing: framing)
        let chunked = try decodeInChunks(fixture.bytes, framing: framing, chunkSize: 7)
        #expect(byteByByte == whole, "\(fixture.testDescription): byte by byte \(byteByByte), whole \(whole)")
        #expect(chunked == whole, "\(fixture.testDescription): 7-byte chunks \(chunked), whole \(whole)")
        for frame in whole.frames {
            #expect(frame.payload.count <= Self.maximumPayloadLength, "\(fixture.testDescription)")
        }
    }

    private func makeReassembler(_ framing: Framing) -> any FrameReassembling {
        framing.makeReassembler(maximumPayloadLength: Self.maximumPayloadLength)
    }

    private func decodeWhole(_ bytes: [UInt8], framing: Framing) throws -> Outcome {
        let reassembler = makeReassembler(framing)
        reassembler.append(bytes)
        var frames: [Frame] = []
        let code = try errorCode {
            while let frame = try reassembler.nextFrame() { frames.append(frame) }
            try reassembler.finish()
        }
        return Outcome(frames: frames, code: code)
    }

    private func decodeByteByByte(_ bytes: [UInt8], framing: Framing) throws -> Outcome {
        let reassembler = makeReassembler(framing)
        let fed = feedByteByByte(bytes, into: reassembler)
        if let failure = fed.failure {
            return Outcome(frames: fed.frames, code: failure.error.code)
        }
        return Outcome(frames: fed.frames, code: try errorCode { try reassembler.finish() })
    }

    private func decodeInChunks(_ bytes: [UInt8], framing: Framing, chunkSize: Int) throws -> Outcome {
        let reassembler = makeReassembler(framing)
        var frames: [Frame] = []
        let code = try errorCode {
            for start in stride(from: 0, to: bytes.count, by: chunkSize) {
                reassembler.append(Array(bytes[start..<min(start + chunkSize, bytes.count)]))
                while let frame = try reassembler.nextFrame() { frames.append(frame) }
            }
            try reassembler.finish()
        }
        return Outcome(frames: frames, code: code)
    }

    /// Runs `body` and returns the code of the ``IPCError`` that ended it, if any; any other error
    /// fails the test.
    private func errorCode(_ body: () throws -> Void) throws -> IPCError.Code? {
        do {
            try body()
            return nil
        } catch let error as IPCError {
            return error.code
        } catch {
            Issue.record("not an IPCError: \(type(of: error)): \(error)")
            throw error
        }
    }
}
