"""Attention drawn for a student: one number per patch over the picture, and every head of every layer as a grid."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ui.charts.figures import axis_titled, plain_figure, rgb_colorscale, to_numpy
from ui.charts.figures_input import image_data_uri
from ui.charts.figures_path import outline

# Transparent where the class token does not look, opaque hot colours where it does: the photo stays visible.
HEAT = [[0.0, "rgba(20,20,90,0)"], [0.2, "rgba(40,40,200,0.12)"], [0.45, "rgba(130,50,220,0.45)"],
        [0.7, "rgba(240,70,40,0.7)"], [1.0, "rgba(255,235,0,0.9)"]]


PALE = 170  # the darkest grey of a picture under an attention overlay


def attention_overlay(rgb, grid, patch_size: int, title: str, zmax: float | None = None,
                      display: int = 224, name: str = "", patch: int | None = None) -> go.Figure:
    """A photo with one number per patch drawn over it as a semi-transparent heatmap.

    rgb: [H, W, 3] uint8 (the model's input, e.g. pixels_to_rgb); grid: [H / patch, W / patch], cell (i, j)
    covering the patch at row i, column j; the picture is drawn pale (PALE), so the heat shows the colour bar's
    colours. Small images (8x8 digits) are upscaled by nearest neighbour to about
    `display` pixels; each heat cell is stretched over its patch. Hover shows the patch and its value; `name`
    names the heat trace (what its numbers are); patch: a followed patch (row-major number) outlined as a token."""
    # The picture drawn pale (its grey levels mapped into PALE..255): over a full-contrast photo the semi-transparent
    # heat blended with dark pixels into colours that were not on the colour bar; over a pale one they are the bar's
    rgb = (PALE + np.asarray(rgb, dtype=np.uint16) * (255 - PALE) // 255).astype(np.uint8)
    grid = to_numpy(grid)
    height, width = rgb.shape[:2]
    if grid.shape != (height // patch_size, width // patch_size):
        raise ValueError(f"grid {grid.shape} does not tile a {height}x{width} image in {patch_size}-pixel patches")
    scale = max(1, display // max(height, width))
    small = height * width <= 4096  # digits and icons: exact pixels as PNG; photos as JPEG
    if scale > 1:
        rgb = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
    step = patch_size * scale
    if zmax is None:
        zmax = float(np.nanmax(grid)) if grid.size else 1.0
    patch_number = np.arange(grid.size, dtype=np.int32).reshape(grid.shape)  # row-major, as the tokens
    heat = dict(
        type="heatmap", z=grid.astype(np.float32), x0=(step - 1) / 2, dx=step, y0=(step - 1) / 2, dy=step,
        zmin=0.0, zmax=zmax or 1.0, colorscale=HEAT, customdata=patch_number, name=name,
        colorbar=dict(orientation="h", thickness=8, len=1.0, y=-0.02, yanchor="top", tickfont=dict(size=10)),
        hovertemplate="patch %{customdata}: %{z:.4f}<extra></extra>")
    image = dict(type="image", source=image_data_uri(rgb, exact=small), hoverinfo="skip")
    shapes = []
    if patch is not None:
        row, col = divmod(patch, grid.shape[1])
        shapes = outline("token", patch, dict(xref="x", yref="y", x0=col * step - 0.5, x1=(col + 1) * step - 0.5,
                                              y0=row * step - 0.5, y1=(row + 1) * step - 0.5))
    return plain_figure([image, heat], title, 330,
                        xaxis=dict(visible=False, range=[-0.5, rgb.shape[1] - 0.5], constrain="domain"),
                        yaxis=dict(visible=False, range=[rgb.shape[0] - 0.5, -0.5], scaleanchor="x",
                                   constrain="domain"),
                        **({"shapes": shapes} if shapes else {}))


def head_grid_figure(maps, layers, title: str, holds=None, zmax: float | None = None,
                     followed=()) -> go.Figure:
    """A layer x head grid of small attention maps tiled into one heatmap (one trace keeps it light).
    holds: per layer, which original head each position holds; a moved head is labelled with it. followed: (row of
    the grid, head position) pairs, each tile outlined as a followed head (figures_path.outline)."""
    maps = to_numpy(maps)
    n_layers, n_heads, cells, _ = maps.shape
    step = cells + 1  # one blank (NaN) row and column between tiles
    tiled = np.full((n_layers * step - 1, n_heads * step - 1), np.nan, dtype=np.float32)
    for i in range(n_layers):
        for h in range(n_heads):
            tiled[i * step:i * step + cells, h * step:h * step + cells] = maps[i, h]
    zmax = zmax if zmax is not None else float(np.nanmax(maps)) or 1.0
    height = max(260, 24 * n_layers + 90)
    moved = [] if holds is None else [
        dict(x=h * step + cells / 2 - 0.5, y=i * step + cells / 2 - 0.5, showarrow=False, text=f"<b>{holds[i][h]}</b>",
             font=dict(color="white", size=11))
        for i in range(n_layers) for h in range(n_heads) if holds[i][h] != h]
    shapes = [shape for row, head in followed for shape in outline(
        "head", head, dict(xref="x", yref="y", x0=head * step - 0.5, x1=head * step + cells - 0.5,
                           y0=row * step - 0.5, y1=row * step + cells - 0.5))]
    return plain_figure(dict(type="heatmap", z=tiled, colorscale=rgb_colorscale("Viridis"), zmin=0.0, zmax=zmax,
                             colorbar=dict(thickness=10), hoverongaps=False), title, height,
                        xaxis=axis_titled("head", tickmode="array",
                                          tickvals=[h * step + cells / 2 - 0.5 for h in range(n_heads)],
                                          ticktext=[str(h) for h in range(n_heads)], showgrid=False),
                        yaxis=axis_titled("layer", tickmode="array",
                                          tickvals=[i * step + cells / 2 - 0.5 for i in range(n_layers)],
                                          ticktext=[str(layer) for layer in layers], autorange="reversed",
                                          showgrid=False),
                        **({"annotations": moved} if moved else {}), **({"shapes": shapes} if shapes else {}))
