"""Training: the drafter trainer and its pure block helpers."""
