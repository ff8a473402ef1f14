"""Data set adapters: turn a foreign file format into hirflow engagement and entity events."""
