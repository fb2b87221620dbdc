"""The server's peak memory after a tour of every page with every zoo model, in several browser sessions.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/memory_tour.py [--sessions 3] [--models a,b] [--check]

Starts the app (streamlit) on a free port, opens N Chromium sessions and walks each through Explore and
Check with every zoo model (Check runs with --check: long on the real models), and every other page with
each of its own models. Then reads the server's peak resident memory (VmHWM, Linux) and compares it with
the goal: at most 2x the sum of the loaded models' float32 weights + 1 GiB. Models are loaded once per
process (the zoo cache), whatever the number of sessions; traces and parameters are in byte-bounded
caches (perm_core.fast.param_cache, ui.compute).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perm_core.models import zoo  # noqa: E402
from serve.local_server import CHROMIUM_FLAGS, chromium_executable, start_streamlit  # noqa: E402

ZOO = (*zoo.explore_menu(), "random:vit", "random:bert", "random:gpt2", "random:llama", "random:gemma3",
       "random:dinov2")
# the pages with their own model menus, each toured with the fast image and text models; Fusion loads its own pair
TOURED = (zoo.DEFAULT_IMAGE_MODEL, zoo.DEFAULT_TEXT_MODEL)
OWN_PAGES = [*(f"{page}?{field}={name}" for page, field in (("backward", "bw_model"), ("authorization", "au_model"),
                                                             ("rotation", "rotation_model")) for name in TOURED),
             "fusion", "split_learning?sl_epochs=2&sl_attack_epochs=3&sl_victims=40", ""]


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def memory_now(pid: int) -> str:
    """The server's resident memory now and its peak so far: a step that raises the peak is where to look."""
    return (f"server RSS {status_kib(pid, 'VmRSS') / 2**20:5.2f} GiB, "
            f"peak so far {status_kib(pid, 'VmHWM') / 2**20:5.2f} GiB")


def start_server() -> tuple[subprocess.Popen, str]:
    """The app on a free loopback port, as make run serves it (start_streamlit), logging to a temporary file."""
    log = Path(tempfile.mkstemp(prefix="memory-tour-", suffix=".log")[1])
    try:
        return start_streamlit(log, {}, healthy_within_s=90)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None


def settle(page) -> None:
    page.wait_for_selector('[data-testid="stApp"]', timeout=600_000)
    page.wait_for_timeout(800)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=600_000)


def float32_weight_bytes(models) -> int:
    import torch

    from perm_core.models.registry import load_model

    total = 0
    for name in models:
        model = load_model(name, dtype=torch.float32).model
        total += sum(p.numel() * 4 for p in model.parameters())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--check", action="store_true", help="also run the Check page on every model")
    args = parser.parse_args()
    models = args.models.split(",")
    from playwright.sync_api import sync_playwright

    server, url = start_server()
    started = time.perf_counter()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_FLAGS)
            tabs = [browser.new_context(viewport={"width": 1440, "height": 1200}).new_page()
                    for _ in range(args.sessions)]
            for session, tab in enumerate(tabs):
                for name in models:
                    tab.goto(f"{url}/explore?model={name}&k_channels={100 + session}")
                    settle(tab)
                    if args.check:
                        tab.goto(f"{url}/check?model={name}")
                        settle(tab)
                        tab.get_by_role("button", name="Run check").click()
                        settle(tab)
                    print(f"session {session + 1}: {name:<14} {memory_now(server.pid)}", flush=True)
                for path in OWN_PAGES:
                    tab.goto(f"{url}/{path}")
                    settle(tab)
                    if path:
                        print(f"session {session + 1}: {path.split('?')[0]:<14} {memory_now(server.pid)}", flush=True)
            peak = status_kib(server.pid, "VmHWM") * 1024
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    weights = float32_weight_bytes(sorted(set(models) | {*TOURED, *zoo.serving(zoo.FUSION)}))
    bound = 2 * weights + 2**30
    print(f"\n{args.sessions} sessions, {len(models)} models, {time.perf_counter() - started:.0f} s")
    print(f"server peak resident memory  {peak / 2**30:6.2f} GiB")
    print(f"loaded models, float32       {weights / 2**30:6.2f} GiB")
    print(f"goal: 2x weights + 1 GiB     {bound / 2**30:6.2f} GiB  -> peak / goal {peak / bound:.2f} "
          f"({'met' if peak <= bound else 'NOT met'})")


if __name__ == "__main__":
    main()
