"""Figures a test measures on a GPU, handed to the GPU check's report: with GTOPK_TEST_FIGURES
naming a file (scripts/gpu/gpu_check.sh's tests stage sets it), each `record_figure` appends one
JSON line to it (xdist workers append whole lines); without it, nothing is written."""

from __future__ import annotations

import json
import os
from typing import Any


def record_figure(figure: str, **values: Any) -> None:
    path = os.environ.get("GTOPK_TEST_FIGURES")
    if path:
        with open(path, "a") as file:
            file.write(json.dumps({"figure": figure, **values}) + "\n")
