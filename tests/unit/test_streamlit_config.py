"""The app's Streamlit settings: no developer toolbar for visitors, the upload limit equals the loader's."""

import gc
import tomllib
import weakref
from pathlib import Path

from perm_core.models.inputs import MAX_IMAGE_BYTES

CONFIG = tomllib.loads((Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml").read_text())


def test_visitors_get_no_deploy_button():
    assert CONFIG["client"]["toolbarMode"] == "viewer"


def test_the_upload_limit_is_the_image_loaders_limit():
    assert CONFIG["server"]["maxUploadSize"] * 2**20 == MAX_IMAGE_BYTES


def test_no_full_collection_after_every_run_and_one_every_few_seconds_instead():
    """Streamlit's per-run full collection walked every session's objects under the GIL; app.py collects
    cycles at most every few seconds (ui.runtime.housekeeping.collect_garbage), which still frees them."""
    from ui.runtime import housekeeping

    assert CONFIG["runner"]["postScriptGC"] is False
    assert "collect_garbage()" in (Path(__file__).resolve().parents[2] / "app.py").read_text()

    class Cycle:
        pass

    housekeeping._last_run.pop("collect", None)
    gc.disable()
    try:
        first = Cycle()
        first.me = first
        ref = weakref.ref(first)
        del first
        assert ref() is not None  # a cycle: reference counting alone keeps it
        assert housekeeping.collect_garbage(min_interval=60)
        assert ref() is None
        again = Cycle()
        again.me = again
        ref = weakref.ref(again)
        del again
        assert not housekeeping.collect_garbage(min_interval=60)  # within the interval: skipped
        assert ref() is not None
    finally:
        gc.enable()


def test_a_light_and_a_high_contrast_dark_theme():
    """Streamlit's theming holds a light and a dark theme that a visitor switches between (Settings); the dark one is
    the high-contrast one: white on black (contrast ratio 21:1), widgets bordered, the primary colour readable on
    black (WCAG's 4.5:1 for text)."""
    def luminance(colour: str) -> float:
        channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    def contrast(a: str, b: str) -> float:
        high, low = sorted((luminance(a), luminance(b)), reverse=True)
        return (high + 0.05) / (low + 0.05)

    light, dark = CONFIG["theme"]["light"], CONFIG["theme"]["dark"]
    assert light["primaryColor"] == CONFIG["theme"]["primaryColor"]
    assert contrast(dark["textColor"], dark["backgroundColor"]) == 21.0
    assert dark["showWidgetBorder"] is True
    for colour in (dark["primaryColor"], dark["linkColor"], dark["borderColor"]):
        assert contrast(colour, dark["backgroundColor"]) >= 4.5, colour


def test_the_apps_css_holds_no_markup():
    """app.py injects assets/app.css through st.html, whose sanitizer drops a style element whose text holds a tag:
    one '<wbr>' in a comment silently removed every rule (metric labels ended in '...', values were cut)."""
    import re

    css = (Path(__file__).resolve().parents[2] / "assets" / "app.css").read_text()
    assert not re.search(r"<[/\w]", css)
    from ui import projector

    assert not re.search(r"<[/\w]", projector.CSS.removeprefix("<style>").removesuffix("</style>"))
