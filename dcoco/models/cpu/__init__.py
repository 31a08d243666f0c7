"""Fused CPU kernels: their C++ sources, the build, the CPU's features."""
