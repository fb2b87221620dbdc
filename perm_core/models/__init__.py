"""Models and inputs: the registry of model names (registry) and the record every loader returns (record), the
zoo table (zoo) and its loaders (checkpoints, gguf_wheel, dinov2; digits trains the shipped ones), Hub names and
local directories (hub), `random:FAMILY` models (random_models), and the inputs: images and texts to tensors
(inputs), an input named by one string (input_spec) and each model's default input (defaults)."""
