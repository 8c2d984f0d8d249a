"""The OCI image builds here without a Docker engine (`make image`: buildah, chroot isolation,
a base made from Debian's packages when none can be pulled) and the built image runs:
`statusgate --version` is the package's, and `statusgate serve` answers /healthz.

Skipped with the reason when buildah is missing (apt-get install buildah debootstrap);
`.ci/run` installs both and sets STATUSGATE_REQUIRE_IMAGE=1, so CI never skips it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import __version__

from conftest import ROOT, free_port

IMAGE = "localhost/statusgate-test"
ENV = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("buildah") is None:
        if os.environ.get("STATUSGATE_REQUIRE_IMAGE"):
            pytest.fail("buildah is not on PATH and STATUSGATE_REQUIRE_IMAGE is set")
        pytest.skip("buildah is not on PATH (apt-get install buildah debootstrap)")
    build = subprocess.run(
        [str(ROOT / "deploy/image/build.sh"), IMAGE, __version__],
        cwd=ROOT,
        env={**ENV, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return f"{IMAGE}:{__version__}"


@pytest.fixture
def container(image: str) -> Iterator[str]:
    made = subprocess.run(
        ["buildah", "from", image], env=ENV, capture_output=True, text=True, check=True
    )
    name = made.stdout.strip()
    yield name
    subprocess.run(["buildah", "rm", name], env=ENV, capture_output=True, check=False)


def run(container: str, *command: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", "run", container, "--", *command],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kw,  # type: ignore[call-overload]
    )


def test_the_image_says_the_package_version(container: str) -> None:
    """`statusgate --version` in the built image is the package's version, run as the
    image's own unprivileged user."""
    version = run(container, "statusgate", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"statusgate {__version__}"
    assert run(container, "id", "-u").stdout.strip() == "10001"


def test_the_image_serves_and_answers_healthz(container: str, tmp_path: Path) -> None:
    """`statusgate serve` in the image, with a config and policy mounted read-only at
    /config and its SQLite store under /data, answers GET /healthz."""
    port = free_port()
    tmp_path.chmod(0o755)  # the image's user (10001) reads the mount
    (tmp_path / "policies").mkdir(mode=0o755)
    shutil.copy(ROOT / "policies/demo-jobs.yaml", tmp_path / "policies")
    (tmp_path / "gateway.yaml").write_text(
        f"listen: {{host: 127.0.0.1, port: {port}}}\n"
        "store: sqlite:////data/statusgate.db\n"
        "policies_dir: policies\n"
    )
    server = subprocess.Popen(
        [
            "buildah", "run", "-e", "DEMO_API_KEY=image-test-key",
            "-v", f"{tmp_path}:/config:ro", container, "--",
            "statusgate", "serve", "--config", "/config/gateway.yaml",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        answer = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    answer = (r.status, r.read())
                    break
            except OSError:
                time.sleep(0.2)
        assert answer is not None, (server.poll(), server.stdout and server.stdout.read1())
        assert answer[0] == 200 and b'"ok"' in answer[1]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
