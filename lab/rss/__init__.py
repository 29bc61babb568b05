"""Receive-side scaling: the Toeplitz model of a NIC's queue choice and the reader of real NIC queues."""
