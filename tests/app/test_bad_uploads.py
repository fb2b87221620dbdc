"""AppTest: a bad upload on Explore and Check is the loader's message in an error box, naming the file, never an
exception; odd but valid images (animated, CMYK, 16-bit) run. The loader's messages themselves:
tests/unit/test_inputs.py; a real upload in Chromium: tests/e2e/test_bad_input.py."""


import pytest
from streamlit.testing.v1 import AppTest

from tests import bad_files
from tests.app.conftest import APP


def page_with_upload(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = "digits-vit"
    at.query_params["img_src"] = "upload"
    at.run()
    at.switch_page(f"pages/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == ["Upload an image, or pick a digit or a sample photo."]
    return at


def image_captions(node) -> list[str]:
    """The captions of every st.image under node (AppTest has no accessor for images)."""
    found = []
    for child in getattr(node, "children", {}).values():
        if getattr(child, "type", "") == "image":
            found += [image.caption for image in child.proto.imgs]
        found += image_captions(child)
    return found


def upload(at: AppTest, name: str, data: bytes, mime: str) -> AppTest:
    at.file_uploader(key="upload").set_value((name, data, mime)).run()
    assert not at.exception, (name, [e.value for e in at.exception])
    return at


@pytest.mark.parametrize("page", ["explore", "check"])
def test_bad_uploads_are_messages_and_odd_images_work(page):
    at = page_with_upload(page)
    for name, (data, mime, message) in bad_files.refused().items():
        errors = [e.value for e in upload(at, name, data, mime).error]
        assert len(errors) == 1 and errors[0].startswith(f"{name}: ") and message in errors[0], (name, errors)
    for name, (data, mime) in bad_files.accepted().items():
        upload(at, name, data, mime)
        assert not at.error, (name, [e.value for e in at.error])
        notices = [w.value for w in at.warning]
        if name == "animated.gif":
            assert "animated.gif is animated (3 frames); the model sees its first frame." in notices
        if page == "explore":
            assert "un-scrambled tensors match" in at.success[0].value, name
            assert f"Original: your upload {name}" in image_captions(at.main), name
        else:
            assert any(b.label == "Run check" for b in at.button)
