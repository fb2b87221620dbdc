"""The app's Streamlit settings: no developer toolbar for visitors, the upload limit equals the loader's."""

import tomllib
from pathlib import Path

from perm_core.inputs import MAX_IMAGE_BYTES

CONFIG = tomllib.loads((Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml").read_text())


def test_visitors_get_no_deploy_button():
    assert CONFIG["client"]["toolbarMode"] == "viewer"


def test_the_upload_limit_is_the_image_loaders_limit():
    assert CONFIG["server"]["maxUploadSize"] * 2**20 == MAX_IMAGE_BYTES
