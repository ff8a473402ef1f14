"""Refresh: dirty nodes re-encoded into index generations and token changes, neighbours paced behind them."""
