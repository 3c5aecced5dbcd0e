// swift-tools-version: 6.1
// Reference systems in Swift for ipcbench: what a Swift developer would use instead of an
// ipcbench transport. A package of its own, independent of the main package (it does not depend
// on it), so that neither gRPC nor NIO Extras is ever built for users of ipcbench.
//
//   swift build -c release          builds ref-nio and ref-grpc (../build.sh does this)
//
// Both executables follow the command-line contract in ../README.md.
import PackageDescription

/// An executable reference: RefCommon and the library products it measures, each given as
/// (product, package).
func reference(_ name: String, using products: [(String, String)]) -> Target {
    .executableTarget(
        name: name,
        dependencies: ["RefCommon"] + products.map { .product(name: $0.0, package: $0.1) }
    )
}

let package = Package(
    name: "ipcbench-references",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ref-nio", targets: ["ref-nio"]),
        .executable(name: "ref-grpc", targets: ["ref-grpc"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        .package(url: "https://github.com/grpc/grpc-swift-2", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport", from: "2.9.2"),
    ],
    targets: [
        // sched_setaffinity's CPU_SET macros, which Swift does not import.
        .target(name: "CRefShims"),
        // The command-line contract, payload pattern, /proc accounting and JSON result shared by
        // both executables.
        .target(name: "RefCommon", dependencies: ["CRefShims"]),
        // Length-prefixed echo over a Unix domain socket with SwiftNIO (NIOPosix + NIOExtras).
        reference(
            "ref-nio",
            using: [("NIOCore", "swift-nio"), ("NIOPosix", "swift-nio"), ("NIOExtras", "swift-nio-extras")]
        ),
        // gRPC unary echo and client-streaming over a Unix domain socket, raw bytes, no protobuf.
        reference(
            "ref-grpc",
            using: [
                ("GRPCCore", "grpc-swift-2"), ("GRPCNIOTransportHTTP2Posix", "grpc-swift-nio-transport"),
                ("NIOCore", "swift-nio"), ("NIOPosix", "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
