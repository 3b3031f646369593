"""What the installed package carries besides Python: libfmha, its header and a CMake
package a C++ program finds with find_package(fmha)."""

import os

import fmha


def test_cmake_package_is_installed():
    config = os.path.join(fmha.cmake_prefix_path, "fmha", "fmhaConfig.cmake")
    assert os.path.isfile(config), f"no CMake package at {config}"
    header = os.path.join(os.path.dirname(fmha._C.__file__), "include", "fmha", "fmha.h")
    assert os.path.isfile(header), f"no header at {header}"
    assert fmha.__version__ == fmha._C.version()
