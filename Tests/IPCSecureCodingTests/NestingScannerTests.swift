import IPCCore
import IPCTestSupport
import Testing

@testable import IPCSecureCoding

/// The pre-scan must never count less nesting than a parser would see.
@Suite(.offTheCooperativePool) struct NestingScannerTests {
    /// The code the JSON scan refuses `text` with, or nil if it accepts it.
    func jsonRefusal(_ text: String, maximumDepth: Int) -> IPCError.Code? {
        refusal { try NestingScanner.checkJSON([UInt8](text), maximumDepth: maximumDepth) }
    }

    /// The code the XML scan refuses `text` with, or nil if it accepts it.
    func xmlRefusal(_ text: String, maximumDepth: Int) -> IPCError.Code? {
        refusal { try NestingScanner.checkXMLPropertyList([UInt8](text), maximumDepth: maximumDepth) }
    }

    func refusal(_ scan: () throws -> Void) -> IPCError.Code? {
        do {
            try scan()
            return nil
        } catch {
            return (error as? IPCError)?.code
        }
    }

    @Test func jsonBracketsInsideStringsDoNotCount() {
        #expect(jsonRefusal(#"[["[[[[", "\"[[[[", "\\", "{{{{"]]"#, maximumDepth: 2) == nil)
        #expect(jsonRefusal(#"[["\\", [[]]]]"#, maximumDepth: 3) == .nestingTooDeep)
        #expect(jsonRefusal(#"[["\"", [[]]]]"#, maximumDepth: 3) == .nestingTooDeep)
    }

    @Test func jsonDepthIsExact() {
        #expect(jsonRefusal(#"{"a": [{"b": []}]}"#, maximumDepth: 4) == nil)
        #expect(jsonRefusal(#"{"a": [{"b": []}]}"#, maximumDepth: 3) == .nestingTooDeep)
        #expect(jsonRefusal("[][][][][]", maximumDepth: 1) == nil)
    }

    @Test func jsonClosingBeforeOpeningIsMalformed() {
        expectIPCError(.malformedPayload) { try NestingScanner.checkJSON([UInt8]("]]]][[[[[["), maximumDepth: 2) }
    }

    @Test func jsonInOtherEncodingsIsMalformed() {
        expectIPCError(.malformedPayload) { try NestingScanner.checkJSON([0xFE, 0xFF, 0x00, 0x5B], maximumDepth: 2) }
        expectIPCError(.malformedPayload) { try NestingScanner.checkJSON([0x5B, 0x00, 0x5D, 0x00], maximumDepth: 2) }
    }

    @Test func xmlEmptyCollectionsDoNotNest() {
        #expect(xmlRefusal("<plist><array><array/><dict /><array></array></array></plist>", maximumDepth: 2) == nil)
        #expect(xmlRefusal("<plist><array><array><array/></array></array></plist>", maximumDepth: 1) == .nestingTooDeep)
    }

    /// swift-foundation's parser reads `<array/x>` as an opening tag, so it must count.
    @Test func xmlTagNameEndsAtSlash() {
        #expect(xmlRefusal("<plist><array/x><array/x></plist>", maximumDepth: 1) == .nestingTooDeep)
        #expect(xmlRefusal("<plist><array attribute='1'><dict\n></dict></array></plist>", maximumDepth: 1) == .nestingTooDeep)
    }

    /// A closing tag the parser skips must not cancel a real opening tag: here the real depth is
    /// 12 while a scan that read the hidden `</array>` tags would never count past 3.
    @Test func xmlClosingTagsHiddenFromTheParserDoNotCount() {
        let hidden = ["<!-- > </array> -->", "<![CDATA[ > </array> ]]>", "<?pi > </array> ?>"]
        for construct in hidden {
            let text = "<plist><array><array>" + String(repeating: "<array>\(construct)", count: 10)
            #expect(xmlRefusal(text, maximumDepth: 3) == .nestingTooDeep, "\(construct)")
        }
    }

    @Test func xmlOpeningTagsHiddenFromTheParserDoNotCount() {
        #expect(xmlRefusal("<plist><array><!-- <array><array> --><string><![CDATA[<dict><dict>]]></string></array></plist>", maximumDepth: 1) == nil)
    }

    @Test func xmlClosingBeforeOpeningIsMalformed() {
        expectIPCError(.malformedPayload) { try NestingScanner.checkXMLPropertyList([UInt8]("<plist></array></array><array><array><array>"), maximumDepth: 2) }
    }

    @Test func xmlPrologueIsChecked() {
        #expect(xmlRefusal("\u{FEFF}  \n<?xml version=\"1.0\" encoding='utf-8'?><plist/>", maximumDepth: 1) == nil)
        #expect(xmlRefusal("<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"x\"><plist/>", maximumDepth: 1) == nil)
        let refused = [
            "<?xml version=\"1.0\" encoding=\"UTF-16\"?><plist/>",
            "<?xml version=\"1.0\" encoding=UTF-7?><plist/>",
            "<!DOCTYPE plist [ <!ENTITY a '>'> ]><plist/>",
            "bplist00\u{1}",
            "( ( ( ) ) )",
            "",
        ]
        for text in refused {
            expectIPCError(.malformedPayload) { try NestingScanner.checkXMLPropertyList([UInt8](text), maximumDepth: 8) }
        }
        expectIPCError(.malformedPayload) { try NestingScanner.checkXMLPropertyList([0xFF, 0xFE, 0x3C, 0x00], maximumDepth: 8) }
    }
}
