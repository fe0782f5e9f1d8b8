"""Benchmarks and the workloads they run; importable as `bench.*` from the repository root."""
