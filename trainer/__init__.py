"""Trainer: time-honest training runs that publish checkpoints."""
