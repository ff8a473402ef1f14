"""Streams: Kafka in and out of the worker. Shared here: config, topics, client settings, the
embedded broker, logs, metrics and the token-change record with its subscriber; by what they do:
`ingest`, `refresh`, `hotswap`, `scaleout`, `api`, `worker` and the command-line `tools`."""
