"""Where the tests find the checkout and the test corpus (in the repository: tests/corpus, see its README)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
