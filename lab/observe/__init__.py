"""Observing a lab: packet captures, the BCC tracer with the kernel BTF it reads, and the XDP exception counter."""
