"""The bound domains of the one engine: `interval` (IBP, a rule per primitive), `linear` (CROWN,
α-CROWN, β-CROWN split constraints) and `difference` (bounds on N#(x) − N(x) between a network and
a hyper-network). Each reads `boundjax.core.primitives` for what kind of function a primitive
computes and evaluates the program of `boundjax.core.program`."""
