"""Applications of the symmetries: backward pass and SGD, model authorization, split learning, fusion."""
