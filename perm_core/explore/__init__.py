"""What the Explore and Guided walk pages compute: one exploration of a scrambled model against the original
(exploration), the MLP's neurons seen before and after (mlp_view), and the walk's steps (walk)."""
