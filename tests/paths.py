"""Where the tests find the checkout and the shared corpus (beside the checkout, as in CI)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus"
