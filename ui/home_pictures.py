"""Home's two pictures: the first held-out scikit-learn digit as 16 patches, and its patches shuffled by token key 7,
computed by the library. They are kept as PNG files in assets/home/ so that Home, the first page a just-started
server shows, imports neither torch nor the library; tests/unit/test_home_pictures.py computes them again and holds
the files to them pixel for pixel. `python -m ui.home_pictures` writes them."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "assets" / "home"
FILES = ("digit.png", "digit-shuffled.png")  # (the digit, its patches shuffled), as pictures() returns them


def pictures():
    """(the digit, its patches shuffled with key 7) as PIL images, each patch grid drawn."""
    import torch

    from perm_core.engine.keys import permutation
    from perm_core.engine.patches import shuffle_patches
    from perm_core.engine.transforms import Permutation
    from perm_core.models.digits import digits_split
    from ui.charts import figures

    _, _, test_x, _ = digits_split(raw=True)
    digit = test_x[:1].double()  # the first held-out scikit-learn digit
    # the class token (position 0) stays; the 16 patches move
    order = Permutation(torch.cat([torch.zeros(1, dtype=torch.long), permutation(7, 16, "home") + 1]))
    return figures.mosaic_image(digit, 2, 160), figures.mosaic_image(shuffle_patches(digit, order, 2), 2, 160)


if __name__ == "__main__":
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, image in zip(FILES, pictures(), strict=True):
        image.save(FOLDER / name)
        print(FOLDER / name)
