import IPCBenchKit
import IPCConformance
import IPCCore
import IPCFraming
import Testing

/// Every session the harness can measure gets an endpoint the transports accept: `ipcbench run
/// --handler task-on-loop` once failed at its first split-cores session with a 66-character name.
@Suite("Harness: session endpoint names")
struct SessionEndpointNameTests {
    @Test("each transport, framing, wait, handler and placement has a valid and distinct endpoint name")
    func everySessionNameIsValidAndDistinct() throws {
        // The identifier of a real run's group has this length (`ipcbench-` and six characters).
        let group = GroupDirectory(path: "/tmp/ipcbench-Qp1qiA")
        var names: Set<String> = []
        var count = 0
        for transport in TransportCatalog.names {
            for framing in [nil] + Framing.allCases.map(Optional.some) {
                for spins in [false, true] {
                    for serving in ConformancePeer.Serving.allCases {
                        for placement in Placement.allCases {
                            let name = LatencyRunner.sessionEndpointName(
                                group: group, transport: transport, framing: framing, spins: spins, serving: serving, placement: placement
                            )
                            _ = try Endpoint(group: group, name: name)
                            names.insert(name)
                            count += 1
                        }
                    }
                }
            }
        }
        #expect(names.count == count)
    }
}
