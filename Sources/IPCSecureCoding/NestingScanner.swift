import IPCCore

/// Cheap, linear, non-recursive checks on untrusted bytes, run before Foundation parses them, so
/// that Foundation's recursive parsers never see a payload nested deeper than the receiver allows.
///
/// Each scanner errs on the side of refusing: where it cannot see the nesting the parser would see
/// (another text encoding, another property-list format) it refuses the payload instead of
/// guessing, and it may count more nesting than a strict parser would accept, never less.
enum NestingScanner {
    /// Checks UTF-8 JSON by counting `[` and `{` outside strings.
    ///
    /// JSONDecoder transcodes UTF-16 and UTF-32 input, whose bytes this count would misread, so
    /// such input is refused: UTF-8 JSON never contains a NUL byte nor the bytes 0xFE and 0xFF
    /// that start the other encodings' byte-order marks.
    /// - Throws: ``IPCError/Code/nestingTooDeep`` beyond `maximumDepth`;
    ///   ``IPCError/Code/malformedPayload`` for a byte that cannot occur in UTF-8 JSON or a closing
    ///   bracket without an opening one.
    static func checkJSON(_ bytes: [UInt8], maximumDepth: Int) throws {
        if let first = bytes.first, first == 0xFE || first == 0xFF {
            throw IPCError(code: .malformedPayload, message: "JSON payloads must be UTF-8; this one starts with a UTF-16 or UTF-32 byte-order mark")
        }
        try bytes.withUnsafeBufferPointer { buffer in
            var depth = 0
            var inString = false
            var escaped = false
            for offset in buffer.indices {
                let byte = buffer[offset]
                if byte == 0 {
                    throw IPCError(code: .malformedPayload, message: "JSON payloads must be UTF-8; byte \(offset) is NUL")
                }
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = true
                    } else if byte == UInt8(ascii: "\"") {
                        inString = false
                    }
                    continue
                }
                switch byte {
                case UInt8(ascii: "\""):
                    inString = true
                case UInt8(ascii: "["), UInt8(ascii: "{"):
                    depth += 1
                    if depth > maximumDepth {
                        throw tooDeep("JSON", maximumDepth: maximumDepth, offset: offset)
                    }
                case UInt8(ascii: "]"), UInt8(ascii: "}"):
                    depth -= 1
                    if depth < 0 {
                        throw IPCError(code: .malformedPayload, message: "JSON closes a bracket it never opened at byte \(offset)")
                    }
                default:
                    break
                }
            }
        }
    }

    /// Checks an XML property list by counting `<array>` and `<dict>` tags; empty ones (`<array/>`)
    /// do not nest. Comments, processing instructions, CDATA sections and the DOCTYPE are skipped
    /// as the parsers skip them, so a closing tag hidden in one cannot cancel a real opening tag.
    ///
    /// Refused, because their nesting cannot be counted here: binary property lists (`bplist`),
    /// whose objects refer to each other by offset; OpenStep text (anything not starting with
    /// `<`), which Foundation falls back to; encodings other than UTF-8, which Foundation
    /// transcodes; inline DTDs, which neither of Foundation's parsers accepts anyway.
    /// - Throws: ``IPCError/Code/nestingTooDeep`` beyond `maximumDepth`;
    ///   ``IPCError/Code/malformedPayload`` for the refused forms above or a closing tag without
    ///   an opening one.
    static func checkXMLPropertyList(_ bytes: [UInt8], maximumDepth: Int) throws {
        // Foundation's XML property-list parser crashes on some invalid UTF-8 (found by the
        // fuzzer: a lead byte 0xF8 inside <integer>), so only valid UTF-8 goes any further.
        guard String(validating: bytes, as: UTF8.self) != nil else {
            throw IPCError(code: .malformedPayload, message: "an XML property list must be valid UTF-8")
        }
        try bytes.withUnsafeBufferPointer { buffer in
            var scanner = XMLScanner(bytes: buffer)
            try scanner.checkPrologue()
            try scanner.checkNesting(maximumDepth: maximumDepth)
        }
    }

    fileprivate static func tooDeep(_ format: String, maximumDepth: Int, offset: Int) -> IPCError {
        IPCError(code: .nestingTooDeep, message: "\(format) nests deeper than the maximum of \(maximumDepth) levels at byte \(offset)")
    }
}

private struct XMLScanner {
    let bytes: UnsafeBufferPointer<UInt8>
    var position = 0

    init(bytes: UnsafeBufferPointer<UInt8>) {
        self.bytes = bytes
    }

    mutating func checkPrologue() throws {
        if hasPrefix("bplist", at: 0) {
            throw malformed("binary property lists are refused: their nesting cannot be checked without parsing them; send the XML format")
        }
        if let nul = bytes.firstIndex(of: 0) {
            throw malformed("XML property lists must be UTF-8; byte \(nul) is NUL")
        }
        if let first = bytes.first, first == 0xFE || first == 0xFF {
            throw malformed("XML property lists must be UTF-8; this one starts with a UTF-16 or UTF-32 byte-order mark")
        }
        if hasPrefix("\u{FEFF}", at: 0) {
            position = 3
        }
        if hasPrefix("<?xml", at: position) {
            try checkDeclaredEncoding()
        }
        while position < bytes.count, isWhitespace(bytes[position]) {
            position += 1
        }
        guard position < bytes.count, bytes[position] == UInt8(ascii: "<") else {
            throw malformed("not an XML property list: it must start with '<' (OpenStep and other formats are refused)")
        }
    }

    /// Both of Foundation's parsers transcode a document whose XML declaration names another
    /// encoding; only UTF-8 is accepted.
    private func checkDeclaredEncoding() throws {
        let end = find("?>", from: position) ?? bytes.count
        guard let name = find("encoding", from: position), name < end else { return }
        var index = name + "encoding".utf8.count
        while index < end, bytes[index] != UInt8(ascii: "\""), bytes[index] != UInt8(ascii: "'") {
            index += 1
        }
        guard index < end else {
            throw malformed("the XML declaration names an encoding without quoting it")
        }
        let quote = bytes[index]
        let valueStart = index + 1
        var valueEnd = valueStart
        while valueEnd < end, bytes[valueEnd] != quote {
            valueEnd += 1
        }
        let value = String(decoding: bytes[valueStart..<valueEnd], as: UTF8.self)
        guard value.lowercased() == "utf-8" else {
            throw malformed("XML property lists must be UTF-8; this one declares \(value.debugDescription)")
        }
    }

    mutating func checkNesting(maximumDepth: Int) throws {
        var depth = 0
        while let open = bytes[position...].firstIndex(of: UInt8(ascii: "<")) {
            // A construct left unterminated ends the scan: the parser fails on it without nesting further.
            if hasPrefix("<!--", at: open) {
                guard let end = find("-->", from: open + 4) else { return }
                position = end + 3
            } else if hasPrefix("<![CDATA[", at: open) {
                guard let end = find("]]>", from: open + 9) else { return }
                position = end + 3
            } else if hasPrefix("<?", at: open) {
                guard let end = find("?>", from: open + 2) else { return }
                position = end + 2
            } else if hasPrefix("<!DOCTYPE", at: open) {
                guard let end = bytes[open...].firstIndex(of: UInt8(ascii: ">")) else { return }
                if bytes[open..<end].contains(UInt8(ascii: "[")) {
                    throw malformed("inline DTDs are refused")
                }
                position = end + 1
            } else {
                guard let close = bytes[open...].firstIndex(of: UInt8(ascii: ">")) else { return }
                let isClosing = open + 1 < close && bytes[open + 1] == UInt8(ascii: "/")
                let nameStart = isClosing ? open + 2 : open + 1
                if isCollectionTag(nameStart: nameStart, end: close) {
                    if isClosing {
                        depth -= 1
                        if depth < 0 {
                            throw malformed("closing tag without an opening tag at byte \(open)")
                        }
                    } else if bytes[close - 1] != UInt8(ascii: "/") {
                        depth += 1
                        if depth > maximumDepth {
                            throw NestingScanner.tooDeep("the XML property list", maximumDepth: maximumDepth, offset: open)
                        }
                    }
                }
                position = close + 1
            }
        }
    }

    /// Whether the tag name starting at `nameStart` is `array` or `dict`. Like swift-foundation's
    /// parser, a name ends at whitespace, `/` or `>`; CoreFoundation's, stricter, rejects some of
    /// these tags, which can only make this count too high, never too low.
    private func isCollectionTag(nameStart: Int, end: Int) -> Bool {
        var nameEnd = nameStart
        while nameEnd < end, !isWhitespace(bytes[nameEnd]), bytes[nameEnd] != UInt8(ascii: "/") {
            nameEnd += 1
        }
        let name = bytes[nameStart..<nameEnd]
        return name.elementsEqual("array".utf8) || name.elementsEqual("dict".utf8)
    }

    private func isWhitespace(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") || byte == UInt8(ascii: "\n") || byte == UInt8(ascii: "\r")
    }

    private func hasPrefix(_ prefix: String, at index: Int) -> Bool {
        let utf8 = prefix.utf8
        guard index + utf8.count <= bytes.count else { return false }
        return bytes[index..<(index + utf8.count)].elementsEqual(utf8)
    }

    private func find(_ pattern: String, from start: Int) -> Int? {
        var index = start
        while let candidate = bytes[index...].firstIndex(of: pattern.utf8.first!) {
            if hasPrefix(pattern, at: candidate) {
                return candidate
            }
            index = candidate + 1
        }
        return nil
    }

    private func malformed(_ message: String) -> IPCError {
        IPCError(code: .malformedPayload, message: message)
    }
}
