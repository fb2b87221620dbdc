"""What every AppTest file shares: the app's entry point (each test opens a page of it with AppTest.from_file), and
one scan of the installed packages for Streamlit components per worker instead of one per AppTest."""

import functools
from pathlib import Path

from streamlit.components.v2 import manifest_scanner

APP = str(Path(__file__).resolve().parents[2] / "app.py")

# Every new AppTest's first run scans every installed distribution's metadata for component manifests (a server does
# it once, at its start): 417 packages, about 0.2 CPU-s on a thread pool each time. The installed packages do not
# change during a test run, so the first scan's answer holds for every later AppTest.
manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)
