"""The class token's attention over the photo: the grid follows the patches, the figure draws the numbers it is
given, and the sample photos carry the credit their licence asks for."""

import numpy as np
import pytest
import torch

from perm_core.engine.patches import shuffle_patches
from perm_core.explore.exploration import Exploration, class_attention_grid, output_summary, patch_grid
from perm_core.models.inputs import photo_credits, sample_images
from perm_core.models.random_models import build_random_model, random_inputs
from ui.charts import figures
from ui.charts.figures_attention import attention_overlay

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dinov2_run():
    model, _ = build_random_model("dinov2", "tiny", seed=0)
    model = model.double().eval()
    exploration = Exploration(model, random_inputs("dinov2", model, 0))
    return exploration, exploration.run({"tokens": 7, "channels": 42, "heads": 3})


def test_class_attention_moves_with_its_patch_and_comes_back(dinov2_run):
    exploration, result = dinov2_run
    pixels = exploration.subject.inputs["pixel_values"]
    grid = patch_grid(exploration.geometry, pixels.shape, exploration.n_tokens)
    assert grid == (4, 4)  # 16-pixel image, 4-pixel patches, plus the class token
    name = "blocks.1.attn"
    original = class_attention_grid(exploration.original[name].tensor, grid)
    scrambled = class_attention_grid(result.scrambled[name].tensor, grid)
    restored = class_attention_grid(result.restored[name], grid)
    torch.testing.assert_close(restored, original, rtol=0, atol=1e-12)
    index = result.scramble.tokens.index  # position j of the scrambled sequence holds token index[j]
    assert index[0] == 0
    torch.testing.assert_close(scrambled.flatten(), original.flatten()[index[1:] - 1], rtol=0, atol=1e-12)
    assert (scrambled - original).abs().max() > 0.1 * original.max()
    # The pictures move the same way: the scrambled patch at grid cell j is the original patch index[j] - 1.
    shuffled = shuffle_patches(pixels, result.scramble.tokens, 4)
    j = 5
    src = int(index[1 + j]) - 1
    torch.testing.assert_close(shuffled[..., (j // 4) * 4:(j // 4 + 1) * 4, (j % 4) * 4:(j % 4 + 1) * 4],
                               pixels[..., (src // 4) * 4:(src // 4 + 1) * 4, (src % 4) * 4:(src % 4 + 1) * 4])


def test_patch_grid_needs_a_class_token_and_a_full_grid(dinov2_run):
    exploration, _ = dinov2_run
    shape = exploration.subject.inputs["pixel_values"].shape
    assert patch_grid(exploration.geometry, shape, exploration.n_tokens + 1) is None
    text_model, _ = build_random_model("bert", "tiny", seed=0)
    from perm_core.families import geometry_of

    assert patch_grid(geometry_of(text_model), shape, 17) is None


def test_image_backbone_output_is_the_class_token_embedding(dinov2_run):
    exploration, result = dinov2_run
    tensors = {k: r.tensor for k, r in exploration.original.items()}
    kind, labels, values = output_summary(tensors, None, None, None, None, image=True)
    assert kind == "image-embedding" and labels is None
    torch.testing.assert_close(values, tensors["output.pooler"][0])
    _, _, back = output_summary(result.restored, None, None, None, None, image=True)
    torch.testing.assert_close(back, values, rtol=0, atol=1e-12)


def test_overlay_figure_draws_the_given_numbers_over_the_picture():
    rgb = (np.arange(16 * 16 * 3) % 256).astype(np.uint8).reshape(16, 16, 3)
    grid = np.arange(16, dtype=float).reshape(4, 4) / 100
    fig = attention_overlay(rgb, grid, 4, "Original:<br>class token's attention<br>block 1", name="heat")
    image, heat = fig.data
    assert image.type == "image" and image.source.startswith("data:image/png;base64,")  # small: exact pixels
    np.testing.assert_array_equal(np.asarray(heat.z, dtype=float), grid.astype(np.float32))
    assert heat.zmin == 0 and heat.zmax == pytest.approx(0.15) and heat.name == "heat"
    step = 4 * (224 // 16)  # upscaled to about 224 pixels, each cell over its patch
    assert heat.dx == heat.dy == step and heat.x0 == heat.y0 == (step - 1) / 2
    assert fig.layout.margin.t > figures.LAYOUT["margin"]["t"]  # three title lines get room above the plot
    with pytest.raises(ValueError, match="does not tile"):
        attention_overlay(rgb, grid[:3], 4, "bad")
    photo = attention_overlay(np.zeros((224, 224, 3), np.uint8), np.zeros((16, 16)), 14, "photo")
    assert photo.data[0].source.startswith("data:image/jpeg;base64,") and photo.data[1].zmax == 1.0


def test_sample_photos_are_credited_from_scikit_learns_readme():
    credits = photo_credits()
    photos = [name for name in sample_images() if name.startswith("Photo")]
    assert sorted(credits) == sorted(photos) and len(photos) == 2
    for line in credits.values():
        assert "CC BY 2.0" in line and "creativecommons.org/licenses/by/2.0" in line and "/photos/" in line
    flower = credits["Photo flower.jpg (scikit-learn sample image)"]
    assert "vultilion" in flower  # the account of the source page is named where it differs from the attribution


def test_head_grid_of_an_encoder_decoder_pools_every_layer_to_one_tile_size():
    """T5's decoder maps (7 tokens) are smaller than its encoder's (12): one grid still holds both stacks."""
    from perm_core.explore.exploration import head_grid
    from perm_core.models.random_models import build_random_model, random_inputs

    model, _ = build_random_model("t5", dtype=torch.float64)
    explorer = Exploration(model, random_inputs("t5", model))
    grid = head_grid(explorer, explorer.run({"heads": 5}))
    assert grid.original.shape == grid.scrambled.shape == (4, 4, 7, 7)
    assert any(held != h for row in grid.holds for h, held in enumerate(row))
    decoder = grid.layers.index(2)  # a decoder layer: its 7x7 maps are shown whole
    assert torch.allclose(grid.original[decoder], explorer.original["blocks.2.attn"].tensor[0].double())
