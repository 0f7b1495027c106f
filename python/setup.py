"""Tags a wheel that carries libcinfer.so (copied in by `make wheel`) for the platform: the
Python code is version-independent (ctypes), the library is not. Metadata: pyproject.toml."""
from pathlib import Path

from setuptools import setup

cmdclass = {}
if (Path(__file__).parent / "cinfer" / "libcinfer.so").exists():
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = PlatformWheel

setup(cmdclass=cmdclass)
