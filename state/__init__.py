"""State: event contracts, decay algebra, the RocksDB graph store and its write path.

Knows nothing of Kafka or torch (see DESIGN.md for the dependency direction).
"""
