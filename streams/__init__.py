"""Streams: topics, the embedded broker, the ingest hot path, the faust worker and the CLI."""
