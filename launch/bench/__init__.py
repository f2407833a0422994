"""Benchmarks: `python -m launch.bench <name> [options]`. Each prints a table and ends with one JSON line of
its figures. Ratios are measured side by side in one run, since these machines are noisy."""
