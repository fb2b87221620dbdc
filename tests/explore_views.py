"""Explore's block views, as the tests expect them: the chosen block shows one view at a time, picked in the "Show"
segmented control (`block_view` in the URL; pages/explore.py's BLOCK_VIEWS, in its order; experts only on a mixture
of experts). Shared by the AppTest (tests/app/test_explore.py) and the Chromium tests (tests/e2e/conftest.py)."""

# The value in the URL -> the label of its button
BLOCK_VIEWS = {"hidden": "Hidden states", "attention": "Attention", "mlp": "MLP neurons", "experts": "Experts chosen",
               "weights": "Weights"}
# The start of each view's charts' titles, after the column's name
VIEW_CHARTS = {"hidden": ("hidden state after block", "|un-scrambled − original|"),
               "attention": ("attention, block",), "mlp": ("MLP neurons of block",),
               "experts": ("experts chosen, block", "routing weights, block"),
               "weights": ("as trained", "what the scrambled model holds", "W′ with the inverse applied")}
DENSE_VIEWS = ("hidden", "attention", "mlp", "weights")  # every view of a model without experts


def block_view_of(title: str) -> str | None:
    """The block view a chart of Explore belongs to, by its title (line breaks as spaces, no markup); None for the
    page's other charts (the class token's overlays, the head grids, the outputs, the proof, the key)."""
    whats = (title, title.split(": ", 1)[-1])  # the title, and what follows its column's name
    return next((view for view, leads in VIEW_CHARTS.items() if any(w.startswith(leads) for w in whats)), None)
