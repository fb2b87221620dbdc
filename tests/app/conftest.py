"""What every AppTest file shares: the app's entry point (each test opens a page of it with AppTest.from_file)."""

from pathlib import Path

APP = str(Path(__file__).resolve().parents[2] / "app.py")
