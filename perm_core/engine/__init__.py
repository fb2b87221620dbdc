"""The engine: the symmetry group and its action. Keys become permutations and rotations (keys), group elements are
chains of permutations and block-orthogonal maps per space (transforms, spec: `Scramble` and the one `apply_axes`
for weights, gradients and activations), each symmetry with its negative controls (symmetries), and the token
permutation of ids, positions, masks and image patches (tokens, patches)."""
