"""Optional speed-ups, each with the plain path as its reference: transformed tensors kept and rebuilt only where a
key change reaches (param_cache), gathers and un-scramble-and-compare in one TorchScript call (batched_gathers), and
a forward as one TorchScript graph (graph_forward)."""
