"""The routing of a mixture-of-experts block as maps of tokens (rows) by experts (columns): which experts each token
chose, and the weight the router gave each choice (perm_core.explore.routing.RoutingView's maps)."""

from __future__ import annotations

from ui.charts.figures_heatmap import heatmap


def _expert_labels(n_experts: int) -> list[str]:
    return [f"E{e}" for e in range(n_experts)]


def choice_map(chosen, title: str, token_labels=None):
    """[tokens, experts]: 1 (lit) where the token chose the expert, 0 where not."""
    fig = heatmap(chosen, title, "expert", "token", colorscale="Greys", symmetric=False, zmax=1.0,
                          y_labels=token_labels, x_labels=_expert_labels(chosen.shape[-1]), log_scale=False)
    fig.data[0].showscale = False  # two values, black where chosen: a colour bar would only say 0 and 1
    return fig


def weight_map(weights, title: str, zmax: float, token_labels=None):
    """[tokens, experts]: the routing weight of each chosen expert, 0 where not chosen; zmax: the same scale in
    every column, so equal colours are equal weights."""
    return heatmap(weights, title, "expert", "token", colorscale="Viridis", symmetric=False, zmax=zmax,
                           y_labels=token_labels, x_labels=_expert_labels(weights.shape[-1]), log_scale=False)
