"""The fleet simulator: simulated engines driven through the real policy and the real
controller core (``simulate``, ``policies``, ``roofline``, ``report``) and the synthetic
engines of tests and benchmarks (``synthetic``)."""
