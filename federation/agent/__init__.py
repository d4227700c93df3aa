"""The capacity agent: runs beside a large member cluster, computes its per-node inventory and
streams it to providers over gRPC (a snapshot, then deltas and heartbeats), so a provider need
not watch that member's pods itself. `capacity.proto` is the contract; `capacity_pb2*.py` are
generated from it (`make proto`)."""
