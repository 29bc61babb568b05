"""Tests of the NIC receive-side-scaling model (lab/rss/toeplitz.py)."""
