"""Benchmark library: processes on loopback, workloads, streaming clients, statistics, reports."""
