"""corpus.py: where Katran's fixture corpus is — shared/conformance/katran beside the repository.

CI and developers have `shared/` next to the clone; L4LAB_KATRAN_CORPUS overrides the path.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KATRAN_CORPUS = Path(os.environ.get("L4LAB_KATRAN_CORPUS", REPO.parent / "shared" / "conformance" / "katran"))
