"""Evaluation protocols that only the benchmarks run, with their unit tests: next-click
prediction on live sessions (`next_click`) and its baselines (`session_baselines`), the
served vector at each staleness (`session_freshness`), the value of freshness hour by hour
(`freshness_value`), and several seeds' results pooled against one baseline run (`pooling`)."""
