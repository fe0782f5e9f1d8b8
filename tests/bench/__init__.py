"""Tests of the benchmark tools: the scaled workload and the peers."""
