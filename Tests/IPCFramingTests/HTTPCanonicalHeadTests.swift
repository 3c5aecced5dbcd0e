import IPCCore
@testable import IPCFraming
import IPCTestSupport
import Testing

/// The HTTP decoder reads a head laid out as this package's encoder writes them in one pass
/// (`canonicalHead`), and scans any other head line by line. These tests pin that the two agree:
/// a head given whole takes the one-pass read when it can, a head given one byte at a time never
/// does (the first call sees one byte), and for the encoder's heads and every one-byte change,
/// deletion, doubling and cut of them, both give the same frame or an error of the same code.
@Suite(.offTheCooperativePool) struct HTTPCanonicalHeadTests {
    static let maximumPayloadLength = 1000

    /// Heads of every kind, in both modes, with the longest and shortest numbers.
    static let frames: [Frame] = [
        Frame(kind: .request, msgid: 7, correlation: 42, payload: Array("hello".utf8)),
        Frame(kind: .message, msgid: 0, correlation: 0),
        Frame(kind: .reply, msgid: UInt32.max, correlation: UInt64.max, payload: [0x0D, 0x0A]),
        Frame(kind: .failure, msgid: 1, correlation: 10, payload: Array(repeating: 0x41, count: 1000)),
        Frame(kind: .message, msgid: 65_536, correlation: 3, payload: Array("hi".utf8)),
    ]

    enum Outcome: Equatable {
        case frame(Frame, consumed: Int)
        case needsMore
        case error(IPCError.Code)
    }

    func decoder(llbsd: Bool, maximumHeaderLength: Int = HTTPWireFormat.defaultMaximumHeaderLength) -> HTTPFrameDecoder {
        HTTPFrameDecoder(maximumPayloadLength: Self.maximumPayloadLength, maximumHeaderLength: maximumHeaderLength, llbsdCompatible: llbsd)
    }

    /// One call with all of `bytes`.
    func whole(_ bytes: [UInt8], llbsd: Bool, maximumHeaderLength: Int = HTTPWireFormat.defaultMaximumHeaderLength) -> Outcome {
        var decoder = decoder(llbsd: llbsd, maximumHeaderLength: maximumHeaderLength)
        return bytes.withUnsafeBytes { step(&decoder, $0) }
    }

    /// Calls with one byte more each time, as far as the decoder goes.
    func byteByByte(_ bytes: [UInt8], llbsd: Bool, maximumHeaderLength: Int = HTTPWireFormat.defaultMaximumHeaderLength) -> Outcome {
        var decoder = decoder(llbsd: llbsd, maximumHeaderLength: maximumHeaderLength)
        var outcome = Outcome.needsMore
        for count in 1...max(1, bytes.count) where outcome == .needsMore {
            outcome = bytes.withUnsafeBytes { step(&decoder, UnsafeRawBufferPointer(rebasing: $0[..<min(count, bytes.count)])) }
        }
        return outcome
    }

    func step(_ decoder: inout HTTPFrameDecoder, _ bytes: UnsafeRawBufferPointer) -> Outcome {
        do {
            switch try decoder.decode(bytes) {
            case .frame(let frame, let consumed): return .frame(frame, consumed: consumed)
            case .needMoreBytes: return .needsMore
            }
        } catch let error as IPCError {
            return .error(error.code)
        } catch {
            return .error(.transportFailure)
        }
    }

    func encoded(_ frame: Frame, llbsd: Bool) throws -> [UInt8] {
        try HTTPFrameEncoder(maximumPayloadLength: Self.maximumPayloadLength, llbsdCompatible: llbsd).encode(frame)
    }

    @Test(arguments: [false, true])
    func theEncodersHeadsAreReadInOnePassAsTheyAreScanned(llbsd: Bool) throws {
        for frame in Self.frames {
            let bytes = try encoded(frame, llbsd: llbsd)
            let headLength = bytes.count - frame.payload.count
            let encoder = HTTPFrameEncoder(maximumPayloadLength: Self.maximumPayloadLength, llbsdCompatible: llbsd)
            #expect(try encoder.encodedHeaderLength(FrameHeader(frame)) == headLength)
            #expect(bytes.withUnsafeBytes { decoder(llbsd: llbsd).canonicalHeadLength($0) } == headLength, "\(frame)")
            #expect(whole(bytes, llbsd: llbsd) == .frame(frame, consumed: bytes.count))
            #expect(byteByByte(bytes, llbsd: llbsd) == .frame(frame, consumed: bytes.count))
            // A head cut anywhere is not read in one pass, and asks for more.
            for cut in 0..<headLength {
                #expect(Array(bytes[..<cut]).withUnsafeBytes { decoder(llbsd: llbsd).canonicalHeadLength($0) } == nil)
            }
        }
    }

    @Test func aHeadLongerThanTheLimitIsRefusedEitherWay() throws {
        let bytes = try encoded(Self.frames[0], llbsd: false)
        let headLength = bytes.count - Self.frames[0].payload.count
        for limit in [headLength - 1, headLength - 2] {
            #expect(bytes.withUnsafeBytes { decoder(llbsd: false, maximumHeaderLength: limit).canonicalHeadLength($0) } == nil)
            #expect(whole(bytes, llbsd: false, maximumHeaderLength: limit) == .error(.frameTooLarge))
            #expect(byteByByte(bytes, llbsd: false, maximumHeaderLength: limit) == .error(.frameTooLarge))
        }
        #expect(bytes.withUnsafeBytes { decoder(llbsd: false, maximumHeaderLength: headLength).canonicalHeadLength($0) } == headLength)
        #expect(whole(bytes, llbsd: false, maximumHeaderLength: headLength) == .frame(Self.frames[0], consumed: bytes.count))
    }

    /// Replacement bytes: each class the scanner tells apart, and bytes that could turn one
    /// field, kind or number into another.
    static let replacements: [UInt8] = [0x00, 0x09, 0x0A, 0x0D, 0x20, 0x30, 0x39, 0x3A, 0x2D, 0x41, 0x61, 0x7A, 0x7F, 0x80, 0xFF]

    @Test(arguments: [false, true])
    func everyChangedDeletedOrCutByteGivesTheSameOutcomeEitherWay(llbsd: Bool) throws {
        var variants = 0, frames = 0, errors = 0
        for frame in Self.frames {
            let bytes = try encoded(frame, llbsd: llbsd)
            let headLength = bytes.count - frame.payload.count
            var changed: [[UInt8]] = []
            for index in 0..<headLength {
                for byte in Self.replacements where byte != bytes[index] {
                    var variant = bytes
                    variant[index] = byte
                    changed.append(variant)
                }
                var deleted = bytes
                deleted.remove(at: index)
                changed.append(deleted)
                var doubled = bytes
                doubled.insert(bytes[index], at: index)
                changed.append(doubled)
                changed.append(Array(bytes[..<index]))
            }
            for variant in changed {
                let oneByOne = byteByByte(variant, llbsd: llbsd)
                #expect(whole(variant, llbsd: llbsd) == oneByOne, "\(String(decoding: variant.prefix(headLength + 1), as: UTF8.self).debugDescription)")
                variants += 1
                if case .frame = oneByOne { frames += 1 }
                if case .error = oneByOne { errors += 1 }
            }
        }
        // Both outcomes are exercised: changes a scanner accepts (a digit in a number, a case
        // change in a field name) and changes it refuses.
        #expect(frames > 100 && errors > 100, "\(variants) variants: \(frames) frames, \(errors) errors")
    }

    /// Heads put together from the encoder's pieces in every combination, most of which it never
    /// writes: each start line with each `IPC-Kind` (or none), numbers at and past their limits,
    /// with leading zeros. Those the scanner accepts are read in one pass, with the same result.
    @Test(arguments: [false, true])
    func everyRecombinationOfTheEncodersPiecesGivesTheSameOutcomeEitherWay(llbsd: Bool) {
        let startLines = ["POST /ipc HTTP/1.1\r\nHost: ipcbench\r\n", "HTTP/1.1 200 OK\r\n", "HTTP/1.1 500 Internal Server Error\r\n"]
        let kinds: [String?] = [nil, "message", "request", "reply", "failure", "Reply"]
        let lengths = ["0", "2", "0002", "1000", "1001", "9223372036854775807", "9223372036854775808", "18446744073709551615", "18446744073709551616"]
        let msgids = ["0", "4294967295", "4294967296", "00000000000000000009"]
        let correlations = ["18446744073709551615", "18446744073709551616", "3"]
        var outcomes: [String: Int] = [:]
        for start in startLines {
            for kind in kinds {
                for length in lengths {
                    for msgid in msgids {
                        for correlation in correlations {
                            let head = start + "Content-Length: \(length)" + (kind.map { "\r\nIPC-Kind: \($0)" } ?? "")
                                + "\r\nIPC-Msgid: \(msgid)\r\nIPC-Correlation: \(correlation)\r\n\r\n"
                            let bytes = Array(head.utf8) + [0x68, 0x69]
                            let oneByOne = byteByByte(bytes, llbsd: llbsd)
                            #expect(whole(bytes, llbsd: llbsd) == oneByOne, "\(head.debugDescription)")
                            let onePass = bytes.withUnsafeBytes { decoder(llbsd: llbsd).canonicalHeadLength($0) } != nil
                            switch oneByOne {
                            case .frame: outcomes[onePass ? "frame, one pass" : "frame, scanned", default: 0] += 1
                            case .error(let code): outcomes["\(code)", default: 0] += 1
                            case .needsMore: outcomes["needs more", default: 0] += 1
                            }
                            // Only a head the scanner accepts is read in one pass.
                            if onePass, case .error = oneByOne { Issue.record("read in one pass, refused when scanned: \(head.debugDescription)") }
                        }
                    }
                }
            }
        }
        // Many accepted heads are read in one pass (leading zeros too: the scanner accepts them),
        // and each refusal is exercised.
        #expect((outcomes["frame, one pass"] ?? 0) > 10, "\(outcomes)")
        #expect((outcomes["\(IPCError.Code.malformedFrame)"] ?? 0) > 10, "\(outcomes)")
        #expect((outcomes["\(IPCError.Code.frameTooLarge)"] ?? 0) > 10, "\(outcomes)")
    }
}
