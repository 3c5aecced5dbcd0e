import IPCCore

// Placeholder: replaced by the HTTP/1.1 framing implementation.
public struct HTTPFrameEncoder: FrameEncoder {
    public var maximumPayloadLength: Int
    public init(maximumPayloadLength: Int) { self.maximumPayloadLength = maximumPayloadLength }
    public func encodeHeader(_ header: FrameHeader, into buffer: inout [UInt8]) throws { fatalError("unimplemented") }
}

public struct HTTPFrameDecoder: FrameDecoder {
    public var maximumPayloadLength: Int
    public init(maximumPayloadLength: Int) { self.maximumPayloadLength = maximumPayloadLength }
    public mutating func decode(_ bytes: UnsafeRawBufferPointer) throws -> DecodeStep { fatalError("unimplemented") }
}
