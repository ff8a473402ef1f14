"""State: event contracts, decay algebra, the RocksDB graph store and its write path.

Knows nothing of Kafka or torch (docs/architecture.md: packages and import direction).
"""
