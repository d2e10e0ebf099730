"""The numpy-only core: the DSpark method (Algorithm 1, the lagged variant, the operator
overrides), the budget policy and its strategies, the online SPS model and the profile
file format.  Imports neither torch, SGLang nor ZeroMQ; everything else uses it, never
the reverse."""
