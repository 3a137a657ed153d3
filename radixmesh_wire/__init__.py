"""RadixMesh's wire contract: the protobuf/gRPC stubs generated from `protos/` (`pb`), and the
codecs both ends of an internal stream share (packed int32 arrays, grammar mask rows, mask steps,
model steps). The client and every service import it; it imports none of them.

`pb` needs grpcio and protobuf only (the client installs with just those); the codecs also need
numpy, which every service has.
"""
