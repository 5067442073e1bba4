"""Benchmarks following the shared protocol (P1 latency, P2 throughput, roofline)."""
