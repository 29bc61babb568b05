"""Benchmarks: the software bench, TRex, Katran side by side, NDR search, generators, NIC queues."""
