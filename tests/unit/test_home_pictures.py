"""Home shows two PNG files instead of computing its pictures (it imports neither torch nor the library): each file
is, pixel for pixel, what the library computes."""

import numpy as np
from PIL import Image

from ui import home_pictures


def test_the_files_are_what_the_library_computes():
    computed, label = home_pictures.pictures()
    assert home_pictures.digit_class() == label and 0 <= label <= 9
    for name, image in zip(home_pictures.FILES, computed, strict=True):
        kept = np.asarray(Image.open(home_pictures.FOLDER / name).convert("RGB"))
        assert np.array_equal(kept, np.asarray(image.convert("RGB"))), name
    digit, shuffled = (np.asarray(i.convert("RGB")) for i in computed)
    assert digit.shape == shuffled.shape and not np.array_equal(digit, shuffled)  # the key moved the patches
