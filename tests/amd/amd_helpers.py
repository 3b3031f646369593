"""Shared by the AMD emulator tests: skips when the toolchain is missing, the paths."""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "tools"))

np = pytest.importorskip("numpy")

from amdemu import build  # noqa: E402

MISSING = build.missing_tools()
requires_toolchain = pytest.mark.skipif(
    bool(MISSING), reason=f"AMD emulator tests need {', '.join(MISSING)} (.ci/amd_emu.sh installs them)")

ARCHS = ("gfx942", "gfx90a")
FULL = os.environ.get("FMHA_TEST_FULL") == "1"
MFMA_DIR = pathlib.Path(os.environ.get("FMHA_MFMA_TABLES", ROOT / "tools" / "amdemu" / "mfma_tables"))
