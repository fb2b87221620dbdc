"""The server's side of an Explore rerun, per model: a rerun that changes nothing (everything cached) and a
channel-key change (a new scrambled run, then the whole page drawn), through Streamlit's AppTest.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/explore_rerun.py [--models digits-vit,dinov2-s,minilm]
        [--repeats 5] [--app path/to/app.py]

A classroom's server runs these under one GIL, so their Python time is what thirty sessions queue for.
--app times another checkout (its own modules are imported from its folder), for a before/after in one session.
Medians of --repeats runs after one warm-up of each kind.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def timed_reruns(app: Path, model: str, repeats: int) -> tuple[float, float]:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(app), default_timeout=600)
    at.query_params["model"] = model
    at.run()
    at.switch_page("pages/explore.py")
    at.run()
    if at.exception:
        raise RuntimeError(f"{model}: {[e.value for e in at.exception]}")

    def rerun(change_key: int | None) -> float:
        if change_key is not None:
            next(t for t in at.text_input if t.key == "k_channels").set_value(str(change_key))
        started = time.perf_counter()
        at.run()
        seconds = time.perf_counter() - started
        if at.exception:
            raise RuntimeError(f"{model}: {[e.value for e in at.exception]}")
        return seconds

    rerun(None)
    rerun(999)
    cached = statistics.median(rerun(None) for _ in range(repeats))
    changed = statistics.median(rerun(1000 + i) for i in range(repeats))
    return cached, changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated (default: the timed checkout's zoo table's default image, "
                                         "photo and text models; a checkout older than the table needs them named)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--app", type=Path, default=Path(__file__).resolve().parents[1] / "app.py")
    args = parser.parse_args()
    app = args.app.resolve()
    sys.path.insert(0, str(app.parent))
    if args.models is None:  # imported only now, from the timed checkout
        from perm_core.models.zoo import DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL

        args.models = ",".join((DEFAULT_IMAGE_MODEL, DEFAULT_PHOTO_MODEL, DEFAULT_TEXT_MODEL))
    print(f"{'model':14} {'cached rerun':>13} {'key change':>11}   ({app})")
    for model in args.models.split(","):
        cached, changed = timed_reruns(app, model, args.repeats)
        print(f"{model:14} {cached:12.3f}s {changed:10.3f}s")


if __name__ == "__main__":
    main()
