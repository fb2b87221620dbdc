"""Charts for the pages: plotly figure builders as plain dicts (figures, and the applications' figures_backward,
figures_fusion, figures_split) and PNG/SVG/CSV export through Kaleido (export). UI-only: the library (perm_core)
never imports this package."""
