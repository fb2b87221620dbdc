"""Running stock models, never mutated: `functional_call` with transformed weights under the model's lock
(stateless), every hidden state, attention map, output and gradient recorded under one naming scheme (trace,
capture), exact float64 numerics (numerics), and the process-wide machinery a run needs: torch threads, glibc malloc
settings and progress with time left (threads, malloc, progress)."""
