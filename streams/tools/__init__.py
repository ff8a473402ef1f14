"""The command-line tools: the CLI, the demo, the synthetic world, replay with its data set adapters, export and the config reference."""
