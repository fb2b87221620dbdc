"""Model authorization: a model locked with a key works only for whoever holds the key."""

import streamlit as st

from perm_core.applications import authorization as auth
from perm_core.engine.keys import LONG_KEY_BITS, InvalidKeyError, parse_long_key
from ui.charts import figures_backward as fb
from ui.errors import show_failure
from ui.export import chart
from ui.long_run import long_run
from ui.runtime import page_run, page_run_bytes, shared_model
from ui.sidebar import ensure_view
from ui.state import lecture_key, publish, seed, seed_choice

MODELS = ("digits-vit", "digits-vit-b", "minilm", "smollm2-135m")
DEFAULT_WRONG = {"digits-vit": 20, "digits-vit-b": 20, "minilm": 5, "smollm2-135m": 3}
LABELS = {"accuracy": "test accuracy", "retrieval": "paraphrase retrieval top-1", "perplexity": "perplexity"}

ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
st.title("Model authorization: a key-locked Transformer")
st.markdown(
    "**The scheme** (after Xu et al., CVPR 2024). The key draws a permutation *P* of the residual channels. "
    "Every weight after the embedding layer (all blocks, their norms, the final norm and the head) is permuted "
    "by *P*, as the channel symmetry prescribes; the embedding layer is published unchanged. A key holder "
    "applies *P* to the embedding features before they enter the locked backbone and gets the original model "
    "back exactly. Without the key (plain features) or with a wrong key, the backbone sees its channels in the "
    "wrong order: a different, untrained network.")
st.caption("Threat model: the locked weights are public, the key is secret. This shows what the symmetry makes "
           "possible; it is not a claim of security against an attacker who fine-tunes or fits P from data.")

row = st.columns([2, 2, 2])
seed_choice("au_model", MODELS, MODELS[0])
model_name = row[0].selectbox("Model", MODELS, key="au_model",
                              help="smollm2-135m: the first load converts the shipped GGUF (about a minute).")
seed("au_key", lecture_key("channels"))
key_text = row[1].text_input("Key", key="au_key", help="a whole number, or a 0x hex string of up to 64 digits "
                                                      "(256 bits), like a cipher key")
seed_choice(f"au_wrong_{model_name}", range(1, 51), DEFAULT_WRONG[model_name], int)
n_wrong = row[2].slider("Wrong keys to try", 1, 50, key=f"au_wrong_{model_name}")
try:
    key = parse_long_key(key_text)
except InvalidKeyError as error:
    st.error(str(error))
    publish()
    st.stop()

try:
    loaded = shared_model(model_name, "float32")
except Exception as error:  # noqa: BLE001 - a one-line message, never a traceback
    show_failure(error, f"Could not load {model_name}")
    st.stop()


def measured(model_name, key, n_wrong, progress):
    return page_run("authorization", (model_name, key, n_wrong),
                    lambda: auth.authorize(shared_model(model_name, "float32"), key, n_wrong, model_name,
                                           progress=progress), nbytes=page_run_bytes(model_name))


with long_run("authorization", (model_name, key, n_wrong), "locking the model and trying keys") as progress:
    result = measured(model_name, key, n_wrong, progress)
label = LABELS[result.metric]
fmt = "{:.1f}" if result.metric == "perplexity" else "{:.1%}"
cols = st.columns(5)
cols[0].metric("Unlocked model", fmt.format(result.original))
cols[1].metric("Right key", fmt.format(result.right_key))
cols[2].metric("No key", fmt.format(result.no_key))
cols[3].metric(f"Wrong keys (mean of {len(result.wrong_keys)})", fmt.format(sum(result.wrong_keys)
                                                                           / len(result.wrong_keys)))
cols[4].metric("Chance" + (" (uniform over the vocabulary)" if result.metric == "perplexity" else ""),
               fmt.format(result.chance))
reach_bits = min(LONG_KEY_BITS, result.key_space_bits)
st.info(f"Keys have up to {LONG_KEY_BITS} bits (this one needs {max(key.bit_length(), 1)}): an attacker needs at "
        f"most 2^{LONG_KEY_BITS} guesses of the key. Separately, the permutation group: "
        f"{loaded.model.config.hidden_size}! orderings of the residual channels, {result.key_space_bits:.0f} bits; "
        f"the keys reach at most 2^{reach_bits:.0f} of them.")
if abs(result.right_key - result.original) <= 1e-6 * max(1.0, abs(result.original)):
    st.success(f"The right key restores the model exactly: {label} {fmt.format(result.right_key)}.")
else:
    st.error(f"The right key changed the {label}: {fmt.format(result.original)} → {fmt.format(result.right_key)}.")
if result.metric == "retrieval":
    st.caption(f"{len(auth.paraphrase_pairs())} paraphrase pairs (assets/samples/paraphrases.json): a query "
               "counts as retrieved when its own paraphrase is the nearest of all second sentences (cosine). "
               "What survives without the key is mostly shared words, which any random encoder keeps.")
elif result.metric == "perplexity":
    st.caption(f"Perplexity of: “{auth.PERPLEXITY_TEXT}”")
chart(fb.authorization_histogram(result, label), width="stretch")
with st.expander("Every wrong key"):
    st.dataframe([{"key": str(k), label: v} for k, v in zip(result.wrong_key_values, result.wrong_keys,
                                                             strict=True)], hide_index=True)
