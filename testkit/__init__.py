"""What the tests and the benchmarks share, outside the installed packages: the plain-Python
reference view sampler (the tests' oracle, the encode benchmark's peer), random views for
shape tests and attention benchmarks, a memory index filled in one call, and a tiny training
config."""
