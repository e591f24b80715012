"""Harness components: pure functions used both by training and by backtests."""
