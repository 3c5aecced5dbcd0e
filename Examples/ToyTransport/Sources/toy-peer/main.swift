import IPCConformance
import ToyTransport

// `toy-peer --group DIR --endpoint NAME --role server|client ...`, as the suite starts it.
await ConformancePeer.main(transport: ToyTransport())
