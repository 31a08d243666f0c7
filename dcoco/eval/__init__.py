"""Evaluation: benchmarks that print numbers (never timed assertions)."""
