"""Encoder: turns sampled views into embeddings (torch); never opens a store."""
