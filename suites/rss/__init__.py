"""Tests of the NIC receive-side-scaling model (lab/bench/rss.py)."""
