"""Side-by-side benchmarks (not tests): run with `make bench`."""
