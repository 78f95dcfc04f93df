//! Benchmark harness.
