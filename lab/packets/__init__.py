"""Packets the lab and the suites share: the scapy GUE layer and the one decoder of encapsulated frames."""
