"""What the tests and the benchmarks share, outside the installed packages: the plain-Python
reference view sampler (the tests' oracle, the encode benchmark's peer) and random views for
shape tests and attention benchmarks."""
