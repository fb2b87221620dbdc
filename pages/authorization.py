"""Model authorization: a model locked with a key works only for whoever holds the key; and its attacker."""

from ui.view import through_app

through_app()  # before the page's own imports: a run without app.py goes again through it

import pandas as pd
import streamlit as st

from perm_core.applications import attack as atk
from perm_core.applications import authorization as auth
from perm_core.engine.keys import KEY_BITS, InvalidKeyError, validate_key
from perm_core.models.zoo import AUTHORIZATION, ZOO, serving
from ui.charts import figures_authorization as fa
from ui.charts import figures_backward as fb
from ui.errors import show_failure
from ui.export import chart
from ui.long_run import shared_result
from ui.runtime import PageRequest, page_run_bytes, page_runs, shared_model
from ui.sidebar import ensure_view
from ui.state import lecture_key, publish, seed, seed_choice

MODELS = serving(AUTHORIZATION)
# a wrong key costs one evaluation: a test-set pass on digits, slower on a text encoder, slowest on a language model
WRONG_BY_TASK = {"image-classification": 20, "sentence-embedding": 5, "causal-lm": 3}
DEFAULT_WRONG = {name: WRONG_BY_TASK[ZOO[name].task] for name in MODELS}
LABELS = {"accuracy": "test accuracy", "retrieval": "paraphrase retrieval top-1", "perplexity": "perplexity"}
STEP_LADDERS = {max(steps): steps for steps in (atk.FINE_TUNE_STEPS[:4], atk.FINE_TUNE_STEPS[:5],
                                                atk.FINE_TUNE_STEPS)}  # fine-tune up to -> the steps measured
HIDDEN_NO_MORE = "“Hidden No More” (ICML 2025)"
SHUFFLING = "“On the (In-)Security of the Shuffling Defense” (ACL 2026)"


def main(runs) -> None:
    """The page's data lives in this frame. runs: where the page's results come from (ui.runtime.page_runs)."""
    ensure_view("own")  # the sidebar says this page has its own controls; the URL keeps them
    st.title("Model authorization: a key-locked Transformer")
    st.markdown(
        "**The scheme** (after Xu et al., CVPR 2024). The key draws a permutation *P* of the residual channels. "
        "Every weight after the embedding layer (all blocks, their norms, the final norm and the head) is permuted "
        "by *P*, as the channel symmetry prescribes; the embedding layer is published unchanged. A key holder "
        "applies *P* to the embedding features before they enter the locked backbone and gets the original model "
        "back exactly. Without the key (plain features) or with a wrong key, the backbone sees its channels in the "
        "wrong order: a different, untrained network.")
    st.caption("Threat model: the locked weights are public, the key is secret. The attacker below also holds the "
               "base checkpoint the model was locked from.")

    row = st.columns([2, 2, 2])
    seed_choice("au_model", MODELS, MODELS[0])
    model_name = row[0].selectbox("Model", MODELS, key="au_model",
                                  help="smollm2-135m: the first load converts the shipped GGUF (about a minute).")
    seed("au_key", lecture_key("channels"))
    key_text = row[1].text_input("Key", key="au_key", help="any whole number 0 .. 2**64-1, as on every page")
    seed_choice(f"au_wrong_{model_name}", range(1, 51), DEFAULT_WRONG[model_name], int)
    n_wrong = row[2].slider("Wrong keys to try", 1, 50, key=f"au_wrong_{model_name}")
    try:
        key = validate_key(key_text)
    except InvalidKeyError as error:
        st.error(str(error))
        publish()
        st.stop()
    try:
        loaded = shared_model(model_name, "float32")
    except Exception as error:  # noqa: BLE001 - a one-line message, never a traceback
        show_failure(error, f"Could not load {model_name}")
        st.stop()

    def computed(page, settings, what, compute):
        return shared_result(runs, PageRequest(page, settings, page_run_bytes(model_name)), what, compute)

    result = computed("authorization", (model_name, key, n_wrong), "locking the model and trying keys",
                      lambda p: auth.authorize(shared_model(model_name, "float32"), key, n_wrong, model_name,
                                               progress=p))
    label = LABELS[result.metric]
    fmt = "{:.1f}" if result.metric == "perplexity" else "{:.1%}"
    show_lock(result, loaded, key, label, fmt)
    attack_section(computed, model_name, key, label, fmt, result.chance)


def key_strength(key: int, channels: int, group_bits: float) -> str:
    """What this key is worth to an attacker who guesses keys, computed from the key: keys are KEY_BITS-bit on every
    page; a small one is found at once by an attacker who counts 0, 1, 2, ..."""
    bits = max(key.bit_length(), 1)
    reach_bits = min(KEY_BITS, group_bits)
    return (f"Keys are {KEY_BITS}-bit whole numbers, as on every page; this one needs {bits} bits. An attacker who "
            f"tries keys in order 0, 1, 2, … finds it at guess {key + 1:,}"
            + (": a key this small is no secret." if bits <= 32 else ".")
            + f" A key drawn at random from all 2^{KEY_BITS} takes 2^{KEY_BITS - 1} guesses on average. Separately, "
            f"the permutation group: {channels}! orderings of the residual channels, {group_bits:.0f} bits; the keys "
            f"reach at most 2^{reach_bits:.0f} of them.")


def show_lock(result, loaded, key, label, fmt) -> None:
    cols = st.columns(5)
    cols[0].metric("Unlocked model", fmt.format(result.original))
    cols[1].metric("Right key", fmt.format(result.right_key))
    cols[2].metric("No key", fmt.format(result.no_key))
    cols[3].metric(f"Wrong keys (mean of {len(result.wrong_keys)})",
                   fmt.format(sum(result.wrong_keys) / len(result.wrong_keys)))
    cols[4].metric("Chance" + (" (uniform over the vocabulary)" if result.metric == "perplexity" else ""),
                   fmt.format(result.chance))
    st.info(key_strength(key, loaded.model.config.hidden_size, result.key_space_bits))
    if abs(result.right_key - result.original) <= 1e-6 * max(1.0, abs(result.original)):
        st.success(f"The right key restores the model exactly: {label} {fmt.format(result.right_key)}.")
    else:
        st.error(f"The right key changed the {label}: {fmt.format(result.original)} → "
                 f"{fmt.format(result.right_key)}.")
    if result.metric == "retrieval":
        st.caption(f"{len(auth.paraphrase_pairs())} paraphrase pairs (perm_core/data/samples/paraphrases.json): "
                   "a query counts as retrieved when its own paraphrase is the nearest of all second sentences "
                   "(cosine). What survives without the key is mostly shared words, which any random encoder keeps.")
    elif result.metric == "perplexity":
        st.caption(f"Perplexity of: “{auth.PERPLEXITY_TEXT}”")
    chart(fb.authorization_histogram(result, label), width="stretch")
    with st.expander("Every wrong key"):
        st.dataframe([{"key": str(k), label: v} for k, v in zip(result.wrong_key_values, result.wrong_keys,
                                                                 strict=True)], hide_index=True)


def attack_section(computed, model_name, key, label, fmt, chance) -> None:
    st.header("The attacker: the key from the base and the locked checkpoints")
    st.markdown(
        "Guessing keys is hopeless, but nobody has to guess. Whoever holds the base checkpoint the model was locked "
        "from and the locked one can recover *P* from the weights alone: the project's own recovery (the one "
        "`compare` runs) matches the rows of the two backbones' norms, biases and head, then runs the locked "
        "backbone behind the embedding layer moved by the recovered *P*. The attacker checks the result without "
        "the key: the base backbone moved by it must be the locked backbone. The literature says the same of "
        f"permutation-based protection: {HIDDEN_NO_MORE} reconstructs inputs from permuted hidden states and "
        f"breaks three such schemes; {SHUFFLING} aligns shuffled activations and recovers the weights of "
        "Pythia-70m and GPT-2.")
    is_digits = model_name.startswith("digits")
    controls = st.columns(2)
    seed_choice("au_attack_lr", atk.FINE_TUNE_RATES, atk.FINE_TUNE_RATES[0], float)
    rate = controls[0].selectbox("Owner's fine-tuning learning rate", atk.FINE_TUNE_RATES, key="au_attack_lr",
                                 format_func=lambda r: f"{r:g}", disabled=not is_digits,
                                 help=f"{atk.FINE_TUNE_RATES[0]:g} is the rate the digits models were trained at; "
                                      f"{atk.FINE_TUNE_RATES[1]:g} moves the weights further, and costs accuracy")
    seed_choice("au_attack_steps", STEP_LADDERS, 300, int)
    most = controls[1].selectbox("Fine-tune up to (steps)", list(STEP_LADDERS), key="au_attack_steps",
                                 disabled=not is_digits)
    steps = STEP_LADDERS[most] if is_digits else ()
    attacked = computed("authorization/attack", (model_name, key, rate, steps), "the attack",
                        lambda p: atk.attack(shared_model(model_name, "float32"), key, model_name, rate, steps,
                                             progress=p))
    cols = st.columns(4)
    cols[0].metric("Key recovered", "exactly" if attacked.recovered_exactly else
                   f"{attacked.share_recovered:.1%} of it")
    cols[1].metric("Attacker's time", f"{attacked.seconds:.2f} s")
    cols[2].metric("Attacker's unlocked model", fmt.format(attacked.unlocked))
    cols[3].metric("Key holder's model", fmt.format(attacked.right_key))
    check = (f"the base backbone moved by the recovered permutation differs from the locked one by "
             f"{attacked.weights_residual:.1e} (relative)")
    if attacked.recovered_exactly and attacked.verified:
        st.warning(f"The key is broken: every one of the {attacked.channels} channel positions recovered in "
                 f"{attacked.seconds:.2f} s, and nothing else moved; {check}, so the attacker knows it is right "
                 f"without the key. The attacker's model: {label} {fmt.format(attacked.unlocked)}, the key "
                 f"holder's: {fmt.format(attacked.right_key)}.")
    else:
        st.info(f"The recovery got {attacked.share_recovered:.1%} of the key's channel positions; {check}. "
                   f"The attacker's model: {label} {fmt.format(attacked.unlocked)}.")
    sweep = attacked.fine_tune
    if sweep is None:
        st.caption("The owner's fine-tuning after locking is measured on the digits models, whose training data "
                   "ships with scikit-learn.")
        return
    st.subheader("The defender's move: fine-tune after locking")
    chart(fa.fine_tune_attack(sweep, chance), width="stretch")
    st.markdown(sweep_sentence(sweep))
    with st.expander("Every fine-tuning step count"):  # st.table wraps its cells: nothing scrolls out at 1024 px
        rows = [{"steps": k, "key recovered": f"{s:.1%}", "attacker": f"{a:.1%}", "owner": f"{o:.1%}",
                 "attacker's check (relative residual)": f"{r:.1e}"}
                for k, s, a, o, r in zip(sweep.steps, sweep.share_recovered, sweep.attacker, sweep.owner,
                                         sweep.weights_residual, strict=True)]
        st.table(pd.DataFrame(rows).set_index("steps"))


def sweep_sentence(sweep) -> str:
    """What the sweep shows, in numbers from it: at the most steps, the key recovered and both accuracies."""
    last = len(sweep.steps) - 1
    k, share, attacker, owner = (sweep.steps[last], sweep.share_recovered[last], sweep.attacker[last],
                                 sweep.owner[last])
    start = sweep.owner[0]
    verdict = ("fine-tuning does not protect the key" if attacker >= owner - 0.02 else
               "fine-tuning hides part of the key")
    return (f"After {k} steps at learning rate {sweep.learning_rate:g} the attacker still recovers {share:.1%} of "
            f"the key and unlocks {attacker:.1%}, against the owner's {owner:.1%} (the owner started from "
            f"{start:.1%}): {verdict}" + (f", at a cost of {100 * (start - owner):.1f} points of the owner's accuracy."
                                          if verdict != "fine-tuning does not protect the key" else "."))


with page_runs() as runs:  # each result's share of the run budget is held until the page is drawn
    main(runs)
