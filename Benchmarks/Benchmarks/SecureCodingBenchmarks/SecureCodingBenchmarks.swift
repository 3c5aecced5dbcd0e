import Benchmark
import BenchmarkSupport
import IPCCore
import IPCSecureCoding

/// Secure decoding per codec, in process: the sample order (``Order/sample(approximateSize:)``,
/// as ``OrderObject`` for the keyed archive) decoded against ``AllowList/orders`` (accepted), and
/// the same bytes against an allow-list that names nothing (refused with `disallowedType`: what
/// a receiver pays to say no). Time and allocations per message. The size in a benchmark's name
/// is the order's size as JSON; the property list and the keyed archive of the same order are
/// larger.
let benchmarks: @Sendable () -> Void = {
    // Allocation counts only, with a little room for this package's own codec; from run to run
    // Foundation's decoders allocate up to four objects more or fewer for the same bytes (a
    // refused 64 KiB JSON order: 30 in one CI run, 34 in the next two), so theirs get more.
    Benchmark.defaultConfiguration = suiteConfiguration(tolerance: 3)
    let codecs: [any PayloadCodec] = [.json, .propertyList, .keyedArchive, .binaryCodable]
    let accepting = AllowList.orders
    let refusing = AllowList()

    for codec in codecs {
        for approximateSize in [256, 4096, 65536] {
            let order = Order.sample(approximateSize: approximateSize)
            let payload = codec.name == "keyedArchive" ? try! codec.encode(OrderObject(order)) : try! codec.encode(order)
            let codecConfiguration = suiteConfiguration(tolerance: codec.name == "binaryCodable" ? 3 : 6)
            Benchmark("DecodeAccepted.\(codec.name).\(sizeLabel(approximateSize))", configuration: codecConfiguration) { benchmark in
                blackHole(try codec.decode(payload, allowing: accepting))
            }
            Benchmark("DecodeRefused.\(codec.name).\(sizeLabel(approximateSize))", configuration: codecConfiguration) { benchmark in
                do {
                    _ = try codec.decode(payload, allowing: refusing)
                    fatalError("\(codec.name) accepted a type outside the allow-list")
                } catch let error as IPCError where error.code == .disallowedType {
                    blackHole(error)
                }
            }
        }
    }
}
