"""Build step pyproject.toml cannot say: the shipped policies into the wheel.

policies/ at the repository's root is their one source (tests, the Kubernetes component and
`make run` read it there); the wheel carries a copy of its *.yaml as gateway/run/shipped/policies,
where `statusgate init` finds them. MANIFEST.in puts policies/ into the sdist, so a wheel
built from the sdist gets them too.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads policies/ in the checkout
        target = Path(self.build_lib, "gateway", "run", "shipped", "policies")
        self.mkpath(str(target))
        for path in sorted([*Path("policies").glob("*.yaml"), *Path("policies").glob("*.yml")]):
            self.copy_file(str(path), str(target / path.name))


setup(cmdclass={"build_py": BuildPy})
