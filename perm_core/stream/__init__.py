"""The layer-streamed check and scramble: a checkpoint read from its safetensors shards one block at a time, in
memory bounded by its largest block rather than by the model (perm_core/stream/check.py says what the proof
rests on)."""
