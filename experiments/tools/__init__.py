"""Tools the entry points use (benchmarks, sweeps, the attention page); the library never imports them."""
