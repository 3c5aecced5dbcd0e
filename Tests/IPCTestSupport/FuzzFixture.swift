public import Foundation
public import Testing

/// An input kept under `Tests/Fixtures/fuzz-regressions/<folder>/`: a hostile stream or payload
/// written by `Fuzz/make-corpus.py`, or one that a fuzz target once failed on. The folder is named
/// for the decoder that replays it: `binary`, `http`, `json`, `propertyList`, `keyedArchive`,
/// `binaryCodable`.
public struct FuzzFixture: Sendable, CustomTestStringConvertible {
    public var folder: String
    public var name: String
    public var bytes: [UInt8]

    public var testDescription: String { "\(folder)/\(name)" }

    /// The fixtures folder, found from this file's path so that the package manifest needs no resources.
    public static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()
        .deletingLastPathComponent()
        .appendingPathComponent("Fixtures/fuzz-regressions")

    /// Every file of one fixture folder, by name; empty if the folder cannot be read, so a test
    /// that uses them must check that there are some.
    public static func all(in folder: String) -> [FuzzFixture] {
        let directory = root.appendingPathComponent(folder)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []
        return names.sorted().compactMap { name in
            FileManager.default.contents(atPath: directory.appendingPathComponent(name).path).map {
                FuzzFixture(folder: folder, name: name, bytes: [UInt8]($0))
            }
        }
    }
}
