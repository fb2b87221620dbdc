"""Home's two pictures: the first held-out scikit-learn digit as 16 patches, and its patches shuffled by token key 7,
computed by the library. They are kept as PNG files in assets/home/ so that Home, the first page a just-started
server shows, imports neither torch nor the library; tests/unit/test_home_pictures.py computes them again and holds
the files to them pixel for pixel. `python -m ui.home_pictures` writes them."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "assets" / "home"
FILES = ("digit.png", "digit-shuffled.png")  # (the digit, its patches shuffled), as pictures() returns them
CLASS_FILE = "digit-class.txt"  # the digit's class in the data set, for Home's caption


def digit_class() -> int:
    """The class of the pictured digit, as the files keep it."""
    return int((FOLDER / CLASS_FILE).read_text())


def pictures():
    """(the digit, its patches shuffled with key 7) as PIL images, dark ink on white with each patch grid drawn, and
    the digit's class."""
    import torch

    from perm_core.engine.keys import permutation
    from perm_core.engine.patches import shuffle_patches
    from perm_core.engine.transforms import Permutation
    from perm_core.models.digits import digits_split
    from ui.charts.figures_input import mosaic_image

    _, _, test_x, test_y = digits_split(raw=True)
    digit = test_x[:1].double()  # the first held-out scikit-learn digit
    # the class token (position 0) stays; the 16 patches move
    order = Permutation(torch.cat([torch.zeros(1, dtype=torch.long), permutation(7, 16, "home") + 1]))
    drawn = (mosaic_image(digit, 2, 160, smooth=True),
             mosaic_image(shuffle_patches(digit, order, 2), 2, 160, smooth=True))
    return drawn, int(test_y[0])


if __name__ == "__main__":
    FOLDER.mkdir(parents=True, exist_ok=True)
    images, label = pictures()
    for name, image in zip(FILES, images, strict=True):
        image.save(FOLDER / name)
        print(FOLDER / name)
    (FOLDER / CLASS_FILE).write_text(f"{label}\n")
