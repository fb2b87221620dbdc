"""Bad input on every page, in Chromium: each case gets a clear message on the page, never an exception box or a
traceback, and the server keeps serving other sessions. The uploads are made in memory (tests/e2e/bad_files.py)."""

import re

import pytest

from tests import bad_files
from tests.e2e.conftest import wait_for_app

BAD_KEYS = {"-1": "got -1", str(2**64): f"got {2**64}", str(10**30): f"got {10**30}", "abc": "got 'abc'",
            "": "got ''"}
VERDICT = "un-scrambled tensors match"
LINK = "is not a valid value here"


def assert_no_trace(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0
    body = page.locator("body").inner_text()
    assert "Traceback" not in body and 'File "/' not in body


def shown(page, text: str, timeout_ms: int = 120_000) -> None:
    """The text is on the page and the run that drew it is over (no fixed waits: the text is the signal)."""
    page.get_by_text(text).first.wait_for(timeout=timeout_ms)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=timeout_ms)
    assert_no_trace(page)


def upload(page, name: str, data: bytes, mime: str) -> None:
    page.locator('input[type="file"]').set_input_files(files=[{"name": name, "mimeType": mime, "buffer": data}])


def test_a_real_bad_upload_is_a_message_and_an_odd_image_works(app_url, page):
    """Through the browser's real upload: a file that is no image and a valid 400-megapixel PNG are each a message
    naming the file, and an animated GIF then runs with its notice. Every bad and odd case on Explore and Check:
    tests/app/test_bad_uploads.py; the loader's messages: tests/unit/test_inputs.py."""
    page.set_viewport_size({"width": 1400, "height": 2400})
    page.goto(f"{app_url}/explore?model=digits-vit&img_src=upload")
    shown(page, "Upload an image, or pick a digit or a sample photo.", 180_000)
    refused = bad_files.refused()
    for name in ("notes.txt", "huge-20000x20000.png"):
        data, mime, message = refused[name]
        upload(page, name, data, mime)
        shown(page, f"{name}: ")
        assert message in page.get_by_text(f"{name}: ").first.inner_text(), name
    data, mime = bad_files.accepted()["animated.gif"]
    upload(page, "animated.gif", data, mime)
    shown(page, VERDICT, 180_000)
    shown(page, "your upload animated.gif")
    shown(page, "animated.gif is animated (3 frames); the model sees its first frame.")
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0


def test_an_upload_over_the_limit_is_refused_and_xsrf_is_on(app_url, page):
    page.goto(f"{app_url}/explore?model=digits-vit&img_src=upload")
    shown(page, "Upload an image", 180_000)
    big = bad_files.photo_png() + b"\0" * (21 * 2**20)
    upload(page, "big.png", big, "image/png")
    shown(page, "File must be 20.0MB or smaller")  # the browser refuses it first (server.maxUploadSize)
    assert page.get_by_text("your upload big.png").count() == 0
    # The server refuses it too: replay the browser's own upload request (session, XSRF token) with a big file.
    with page.expect_request(lambda r: "/_stcore/upload_file/" in r.url and r.method == "PUT") as sent:
        upload(page, "small.png", bad_files.photo_png(), "image/png")
    shown(page, VERDICT, 180_000)
    token = {k: v for k, v in sent.value.all_headers().items() if k.lower() == "x-xsrftoken"}
    assert token, "Streamlit's frontend sends its XSRF token with uploads"
    too_big = page.request.put(sent.value.url, headers=token,
                               multipart={"file": {"name": "big.png", "mimeType": "image/png", "buffer": big}})
    assert too_big.status == 413
    no_token = page.request.put(sent.value.url, multipart={
        "file": {"name": "small.png", "mimeType": "image/png", "buffer": bad_files.photo_png()}})
    assert no_token.status == 403  # XSRF protection on: an upload without the token is refused


# Backward with one SGD step: the text is read before any training, and each case costs a run
@pytest.mark.parametrize("where", ["explore?model=minilm&txt_src=text",
                                   "backward?bw_model=minilm&bw_dtype=float32&bw_steps=1"])
def test_bad_texts(app_url, page, where):
    page.goto(f"{app_url}/{where}")
    explore = where.startswith("explore")
    box = page.get_by_role("textbox", name="Your text" if explore else "Input text", exact=True)
    wait_for_app(page, 180_000)
    submit = "Control+Enter" if explore else "Enter"  # a text area, or a text input
    cases = [("", "the input is empty"), ("word " * 5000, "tokens were dropped")]
    if explore:  # Backward reads its text the same way (perm_core.models.inputs.prepare_text); each case costs a run
        cases += [("   \n\t  ", "the input is empty"), ("Hello мир 世界 مرحبا नमस्ते 🙂 Ωμέγα", VERDICT)]
    for text, expected in cases:
        box.fill(text)
        box.press(submit)
        shown(page, expected, 180_000)


def test_bad_keys_on_every_page_with_a_key(app_url, page):
    """Every bad key in the sidebar (Explore), and one each on the pages with their own key box."""
    page.goto(f"{app_url}/explore?model=digits-vit&k_channels=-1")
    shown(page, BAD_KEYS["-1"], 180_000)
    box = page.get_by_label("channels key", exact=True)
    for value in list(BAD_KEYS)[1:]:
        box.fill(value)
        box.press("Enter")
        shown(page, BAD_KEYS[value])
    too_long = str(2**256)  # far over the 64-bit keys every page takes
    for link, value, expected in (("check?model=digits-vit&k_tokens=", "", BAD_KEYS[""]),
                                  ("backward?bw_key=", "abc", BAD_KEYS["abc"]),
                                  ("authorization?au_key=", too_long, f"got {too_long}"),
                                  ("split_learning?sl_key=", str(2**64), BAD_KEYS[str(2**64)]),
                                  ("rotation?rotation_key=", str(10**30), BAD_KEYS[str(10**30)]),
                                  ("walk?walk_key=", "-1", BAD_KEYS["-1"])):
        page.goto(f"{app_url}/{link}{value}")
        shown(page, expected, 180_000)
        assert page.get_by_text("must be a whole number").count() >= 1, link


# page?query -> what the page must say about it (besides rendering without a trace): two pages in a real browser,
# one with the sidebar's controls and one with its own; every page's bad links: tests/app/test_url_state.py
LINKS = {
    "explore?model=digits-vit&layer=-1&head=-2": "layer=-1",
    "authorization?au_model=../../etc/passwd": "au_model=../../etc/passwd",
}


@pytest.mark.parametrize("link", list(LINKS))
def test_bad_links_say_what_they_ignored(app_url, page, link):
    page.goto(f"{app_url}/{link}")
    shown(page, LINK, 180_000)
    assert page.get_by_text(LINKS[link]).count() >= 1


def test_unknown_pages_and_parameters_on_every_page(app_url, page):
    page.goto(f"{app_url}/no-such-page?model=nope")
    shown(page, "Page not found", 120_000)
    for path in ("?model=nope&layer=-1", "walk?walk_step=-1&whatever=%3Cscript%3Ealert(1)%3C/script%3E",
                 "matrix?x=1"):
        page.goto(f"{app_url}/{path}")
        wait_for_app(page, 240_000)
        assert_no_trace(page)
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        assert page.locator("script").filter(has_text="alert(1)").count() == 0
        if path.startswith("walk"):
            assert page.get_by_text("walk_step=-1").count() == 1
    # After all of this, the server still serves a new session its verdict.
    page.goto(f"{app_url}/explore?model=digits-vit&k_channels=5")
    shown(page, VERDICT, 180_000)


def test_failures_are_logged_with_their_traceback_while_the_page_shows_a_line(browser, tmp_path):
    """A server whose model cache is a file (so dinov2-s cannot load) and whose Explore cache size is not a
    number (so Explore fails unexpectedly): each page says so in one line with a reference, the log has the
    traceback under that reference, and the server goes on serving the pages that can work."""
    from benchmarks.classroom_report import ServerProcess

    cache = tmp_path / "cache-is-a-file"
    cache.write_text("not a directory")
    env = {"TRANSFORMER_SYMMETRY_CACHE": str(cache), "TSE_EXPLORATIONS_CACHE_MB": "not-a-number"}
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        with ServerProcess(tmp_path / "server.log", env) as server:
            page = context.new_page()
            page.goto(f"{server.url}/explore?model=dinov2-s")
            shown(page, "Could not load dinov2-s", 180_000)
            load_failure = page.get_by_text("Could not load dinov2-s").first.inner_text()
            page.goto(f"{server.url}/explore?model=digits-vit")
            shown(page, "Something went wrong on this page (ValueError)", 180_000)
            page_failure = page.get_by_text("Something went wrong").first.inner_text()
            page.goto(f"{server.url}/rotation?rotation_model=digits-vit")
            shown(page, "Rotated model is the same function", 180_000)
            log = server.log.read_text()
    finally:
        context.close()
    for shown_line, cause in ((load_failure, "FileExistsError"), (page_failure, "not-a-number")):
        assert "Traceback" not in shown_line and 'File "' not in shown_line
        reference = re.search(r"reference ([0-9a-f]{8})", shown_line).group(1)
        logged = log[log.index(f"(reference {reference})"):][:20_000]
        assert "Traceback (most recent call last)" in logged and cause in logged, logged[:3000]
