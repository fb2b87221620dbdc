"""perm_core: exact permutation and rotation symmetries of Transformers.

The library behind the Transformer Symmetry Explorer. It never imports streamlit.
"""
