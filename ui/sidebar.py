"""The sidebar every page shares: model, input, keys, dtype, device -> a `View` in session state.

Pages read `current_view()`; they never load models or parse inputs themselves. Every problem (a
model that will not load, a bad upload, an invalid key) becomes a message in `View.problems`, shown
by the page with st.error, so the app keeps running.
"""

from __future__ import annotations

import hashlib
import io

import streamlit as st
import torch

from perm_core.engine.keys import InvalidKeyError, validate_key
from perm_core.engine.symmetries import SYMMETRIES
from perm_core.families import family_names, geometry_of
from perm_core.models import inputs as model_inputs
from perm_core.models import zoo
from perm_core.models.input_spec import digit_image
from perm_core.models.registry import ModelLoadError
from ui import view as light
from ui.errors import logged
from ui.runtime import shared_model
from ui.state import DEFAULT_KEYS, parse_bool, seed
from ui.view import _THIS_RUN, NOTES, View, _keep_sidebar_state, current_view, end_run, without_controls  # noqa: F401

SYMMETRY_LABELS = {"tokens": "Tokens", "channels": "Channels", "heads": "Heads", "head_channels": "Head channels",
                   "mlp": "MLP neurons", "rotation": "Rotations", "experts": "Experts",
                   "router_shift": "Router shift"}
DEFAULT_ON = ("tokens", "channels")
MAX_TOKENS = 128  # the Explore page draws tokens x tokens maps; longer texts are truncated with a notice
# What the notice calls that limit: the visitor chose none ("the chosen limit" read as if they had)
LIMIT_REASON = f"this app's limit, so that its {MAX_TOKENS} x {MAX_TOKENS} token maps stay readable"
# The trained models, then a tiny random model of every supported family (the symmetry matrix links to them).
ZOO = (*zoo.explore_menu(), *(f"random:{family}" for family in family_names()))
SLOW_FIRST_LOAD = {entry.name: entry.first_load for entry in zoo.ZOO.values() if entry.first_load}


@st.cache_resource(show_spinner=False)
def _samples() -> tuple[dict, dict]:
    return model_inputs.sample_images(), model_inputs.sample_texts()


@st.cache_resource(show_spinner=False)
def _credits() -> dict[str, str]:
    return model_inputs.photo_credits()


@st.cache_resource(show_spinner=False)
def test_digits():
    from perm_core.models.digits import digits_split

    _, _, test_x, test_y = digits_split(raw=True)
    return test_x, test_y


def default_model() -> str:
    """The real photo model when its wheel is installed, else the shipped digits classifier (always offline)."""
    photo = zoo.ZOO[zoo.DEFAULT_PHOTO_MODEL]
    return photo.name if photo.loader.available(photo.name) else zoo.DEFAULT_IMAGE_MODEL


def devices() -> list[str]:
    return ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]


def ensure_view(scope: str = "full") -> View:
    """ui.view.ensure_view, rendering this sidebar where the page has its controls."""
    return light.ensure_view(scope, render_sidebar)


def render_sidebar(scope: str = "full") -> View:
    """scope "full": model, input and keys act on the page; "own": the page has its own controls, and "none":
    it has none, so the sidebar shows none of these (a control beside the page that does not act on it would
    mislead)."""
    if scope in NOTES:
        return without_controls(scope)
    if st.session_state.pop("_sidebar_hidden", False):
        _keep_sidebar_state()
    with st.sidebar:
        st.markdown("### Model")
        seed("model", default_model(), valid=lambda v: v in ZOO)
        name = st.selectbox("Model", ZOO, key="model", help="offline zoo models; random:* are tiny random ones")
        seed("dtype", "float32", valid=lambda v: v in ("float32", "float64"))
        cols = st.columns(2)
        dtype_name = cols[0].radio("dtype", ("float32", "float64"), key="dtype", horizontal=False)
        seed("device", devices()[0], valid=lambda v: v in devices())
        device = cols[1].radio("device", devices(), key="device")
        view = View(name, dtype_name, device)
        _load(view)
        if view.loaded is not None:
            st.caption(view.loaded.info.description)
            st.markdown("### Input")
            if model_inputs.takes_text(view.loaded):  # with or without a tokenizer
                _text_input(view)
            else:
                _image_input(view)
        st.markdown("### Keys")
        _keys(view)
    st.session_state["view"] = view
    _THIS_RUN.view = view
    return view


def _load(view: View) -> None:
    note = SLOW_FIRST_LOAD.get(view.model_name)
    try:
        if note:
            with st.spinner(f"Loading {view.model_name}: {note} ..."):
                view.loaded = shared_model(view.model_name, view.dtype_name)
        else:
            view.loaded = shared_model(view.model_name, view.dtype_name)
    except ModelLoadError as error:
        view.problems.append(logged(error))


def _image_input(view: View) -> None:
    images, _ = _samples()
    digits_model = view.loaded.image_channels == 1
    sources = ("digit", "sample", "upload")
    seed("img_src", "digit" if digits_model else "sample", valid=lambda v: v in sources)
    source = st.radio("Image", sources, key="img_src", horizontal=True,
                      format_func={"digit": "Digit picker", "sample": "Sample photo", "upload": "Upload"}.get)
    image = None
    if source == "digit":
        test_x, test_y = test_digits()
        seed("digit", 0, int, valid=lambda v: 0 <= v < len(test_x))
        index = st.number_input(f"Held-out test digit # (0-{len(test_x) - 1})", 0, len(test_x) - 1, key="digit")
        image = digit_image(int(index))
        view.input_id = view.input_spec = f"digit:{int(index)}"
        view.input_label = f"test digit #{int(index)} (label {int(test_y[int(index)])})"
    elif source == "sample":
        names = list(images)
        photos = [n for n in names if n.startswith("Photo")]
        seed("img_sample", (photos or names)[0] if not digits_model else names[0], valid=lambda v: v in names)
        chosen = st.selectbox("Sample picture", names, key="img_sample")
        image, view.input_id, view.input_label = images[chosen], f"sample:{chosen}", chosen
        view.input_spec = view.input_id
        view.credit = _credits().get(chosen, "")
    else:
        upload = st.file_uploader("Upload an image (PNG, JPEG, ...)", key="upload")
        if upload is None:
            view.problems.append("Upload an image, or pick a digit or a sample photo.")
            return
        data = upload.getvalue()
        image, problem = image_from_upload(upload.name, data)
        if problem:
            view.problems.append(problem)
            return
        view.input_id = "upload:" + hashlib.sha1(data).hexdigest()
        view.input_label = f"your upload {upload.name}"
        frames = frame_count(data)
        if frames > 1:
            view.notices.append(f"{upload.name} is animated ({frames} frames); the model sees its first frame.")
    try:
        view.inputs = {"pixel_values": model_inputs.image_to_pixels(image, view.loaded)}
        view.image = image
    except model_inputs.InputError as error:
        view.problems.append(str(error))


def image_from_upload(name: str, data: bytes):
    """-> (PIL image, None) or (None, one-line message naming the file)."""
    try:
        return model_inputs.load_image(data), None
    except model_inputs.InputError as error:
        return None, f"{name}: {error}"


def frame_count(data: bytes) -> int:
    """Frames in an (already decoded once) upload: an animated GIF, PNG or WebP has several."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return int(getattr(image, "n_frames", 1))
    except Exception:  # noqa: BLE001 - only a notice depends on it
        return 1


TEXT_SOURCES = {"sample": "Sample text", "text": "Your text", "ids": "Token ids"}


def _text_input(view: View) -> None:
    """Text through the tokenizer; or token ids drawn from the vocabulary (the default without a tokenizer)."""
    _, texts = _samples()
    has_tokenizer = view.loaded.tokenizer is not None
    sources = tuple(TEXT_SOURCES)
    # The sources of a model without a tokenizer have their own key, so switching models keeps both choices.
    source_key = "txt_src" if has_tokenizer else "ids_src"
    seed(source_key, "sample" if has_tokenizer else "ids", valid=lambda v: v in sources)
    source = st.radio("Text", sources, key=source_key, horizontal=True, format_func=TEXT_SOURCES.get)
    if not has_tokenizer:
        st.caption("This model has no tokenizer: a text becomes one vocabulary id per word (a hash of the "
                   "word); token ids are drawn from the vocabulary by a seed.")
    if source == "ids":
        window = model_inputs.model_window(view.loaded) or MAX_TOKENS
        most = max(1, min(window, MAX_TOKENS))
        seed("n_ids", min(model_inputs.DEFAULT_N_TOKENS, most), int, valid=lambda v: 1 <= v <= most)
        if st.session_state.get("n_ids", 1) > most:
            st.session_state["n_ids"] = most
        seed("ids_seed", 0, int, valid=lambda v: 0 <= v < 2**31)
        cols = st.columns(2)
        n_ids = int(cols[0].number_input(f"Tokens (1-{most})", 1, most, key="n_ids"))
        id_seed = int(cols[1].number_input("Seed", 0, 2**31 - 1, key="ids_seed"))
        try:
            view.inputs = model_inputs.token_ids(view.loaded, n_ids, id_seed)
        except model_inputs.InputError as error:
            view.problems.append(str(error))
            return
        view.input_id = view.input_spec = f"ids:{n_ids}:{id_seed}"
        view.input_label = f"{n_ids} token ids drawn with seed {id_seed}"
        return
    if source == "sample":
        names = list(texts)
        seed("txt_sample", "Permutation" if "Permutation" in names else names[0], valid=lambda v: v in names)
        chosen = st.selectbox("Sample text", names, key="txt_sample")
        text, view.input_label = texts[chosen], chosen
        view.input_spec = f"text-sample:{chosen}"
    else:
        seed("text", "Transformers do not care about the order of their channels.")
        text = st.text_area("Your text", key="text", height=100)
        view.input_label = "your text"
        view.input_spec = f"text:{text}"
    try:
        encoding, notice = model_inputs.prepare_text(text, view.loaded, max_tokens=MAX_TOKENS,
                                                     limit_reason=LIMIT_REASON)
    except model_inputs.InputError as error:
        view.problems.append(str(error))
        return
    if notice:
        view.notices.append(notice)
    view.inputs = encoding
    view.input_id = "text:" + hashlib.sha1(text.encode()).hexdigest()


def _keys(view: View) -> None:
    st.caption("A key is a whole number 0 .. 2^64-1; each switched-on symmetry draws its transform from it.")
    geometry = geometry_of(view.loaded.model) if view.loaded is not None else None
    lacking = {**geometry.not_holding(), **geometry.not_applicable()} if geometry is not None else {}
    for name in SYMMETRIES:
        seed(f"on_{name}", name in DEFAULT_ON, parse_bool)
        seed(f"k_{name}", str(DEFAULT_KEYS[name]))
        left, right = st.columns([3, 2], vertical_alignment="bottom")
        on = left.toggle(SYMMETRY_LABELS[name], key=f"on_{name}")
        raw = right.text_input(f"{name} key", key=f"k_{name}", label_visibility="collapsed", disabled=not on)
        if not on:
            continue
        if name in lacking:
            st.caption(f":orange[Not a symmetry of this model:] {lacking[name]}")
        try:
            view.keys[name] = validate_key(raw)
        except InvalidKeyError as error:
            message = f"{SYMMETRY_LABELS[name]} key: {error}"
            st.error(message)
            view.problems.append(message)
