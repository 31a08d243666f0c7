"""Measuring a running server: the HTTP load client, its report, the soak."""
