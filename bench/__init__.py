"""Side-by-side benchmarks (not tests): `make bench` / `python -m bench`; results in docs/benchmarks.md."""
