"""Side-by-side performance benchmarks (``make bench``); see tests/bench/README.md."""
