"""Ingest: engagements and entities from Kafka into state, forwarded sides, dead letters and the topics' identity."""
