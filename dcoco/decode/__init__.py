"""Decoding stages: sampling, proposing, verification."""
