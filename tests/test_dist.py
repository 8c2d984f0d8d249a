"""`make dist`'s sdist and wheel, and the wheel installed alone: built once per session with
`python -m build` (the wheel from the sdist, as make dist does), the wheel installed into a
fresh virtualenv outside the checkout (its dependencies from the package index pip is set up
with, at requirements.lock's versions), then `statusgate --version`, `init`, `check`, the demo
provider and `serve` run from that virtualenv, with the checkout off every path, and a job
submitted through the gateway and polled to its end.

No skip: `build` is a dev extra (make install), and the index pip uses is the one every
`make test` installs from.
"""

from __future__ import annotations

import email
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway import __version__

from conftest import ROOT, free_port

# the build (~15 s), the virtualenv and its dependencies (~40 s), serve and a job: bounded
# generously for a loaded machine, never for speed
pytestmark = pytest.mark.timeout(900)

POLICIES = sorted(path.name for path in (ROOT / "policies").glob("*.yaml"))
WHEEL_NAME = f"statusgate-{__version__}-py3-none-any.whl"


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    root: Path
    home: Path  # the cwd and HOME of every command: outside the checkout

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: the virtualenv first on PATH, no PYTHONPATH, no key of the
        test process's own."""
        path = f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        return {"PATH": path, "HOME": str(self.home), "LANG": "C.UTF-8", **extra}

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.root / "bin" / args[0]), *args[1:]],
            cwd=self.home,
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def without_pythonpath() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    if importlib.util.find_spec("build") is None:
        pytest.fail("python -m build is missing: `make install` (the dev extra) brings it")
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return Dist(out / f"statusgate-{__version__}.tar.gz", out / WHEEL_NAME)


@pytest.fixture(scope="module")
def venv(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    home = tmp_path_factory.mktemp("elsewhere")
    assert not home.resolve().is_relative_to(ROOT)
    root = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    pip = [str(root / "bin/python"), "-m", "pip", "install", "--quiet"]
    install = subprocess.run(
        [*pip, "-c", str(ROOT / "requirements.lock"), str(dist.wheel)],
        cwd=home,
        env=without_pythonpath(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return Venv(root, home)


def test_the_sdist_carries_the_policies_and_licence_and_no_tests(dist: Dist) -> None:
    """The sdist (from which the wheel was built) holds LICENSE, pyproject.toml, setup.py and
    every shipped policy under policies/, and no tests/ or var/."""
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    expected = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "gateway/run/cli.py"}
    assert expected <= names
    assert {f"policies/{name}" for name in POLICIES} <= names
    assert not [name for name in names if name.startswith(("tests/", "var/", "dist/"))]


def test_the_wheel_carries_the_package_its_data_and_the_policies_only(dist: Dist) -> None:
    """The wheel holds every module and data file of gateway/ (the store's lua/ and sql/, the
    console's assets, the starter config), the shipped policies byte for byte under
    gateway/run/shipped/policies, the licence, and nothing else: no tests/, var/ or policies/."""
    package = ROOT / "gateway"
    in_tree = {
        f"gateway/{path.relative_to(package)}"
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert {"gateway/store/postgres/sql/layout_1.sql", "gateway/store/redis/lua/cas.lua"} <= in_tree
    assert "gateway/operator/console/console.js" in in_tree
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        shipped = {f"gateway/run/shipped/policies/{name}" for name in POLICIES}
        assert {name for name in names if name.startswith("gateway/")} == in_tree | shipped
        for name in POLICIES:
            copy = wheel.read(f"gateway/run/shipped/policies/{name}")
            assert copy == (ROOT / "policies" / name).read_bytes()
        info = f"statusgate-{__version__}.dist-info"
        assert {name.split("/", 1)[0] for name in names} == {"gateway", info}
        assert f"{info}/licenses/LICENSE" in names
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "Apache-2.0"


def test_the_docs_name_the_wheel_make_dist_builds() -> None:
    """Every wheel file name the README and docs/ write is the one make dist builds (the
    version moves with every store layout change)."""
    named = re.compile(r"statusgate-[0-9][^\s/'\"\[]*\.whl")
    found = {
        (path.name, name)
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for name in named.findall(path.read_text())
    }
    assert found, "docs/install.md names the wheel"
    assert {name for _, name in found} == {WHEEL_NAME}, found


@pytest.fixture
def started(venv: Venv) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def start(venv: Venv, started: list[subprocess.Popen[bytes]], log: Path, *args: str,
          env: dict[str, str]) -> subprocess.Popen[bytes]:  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(venv.root / "bin/statusgate"), *args],
            cwd=venv.home,
            env=venv.env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started.append(process)
    return process


def call(
    url: str, body: dict[str, object] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {})  # noqa: S310 (loopback)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback)
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def wait_for_health(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if call(url)[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered: {log.read_text()[-3000:]}")


def test_the_wheel_alone_inits_checks_serves_and_paces_a_job(
    venv: Venv, started: list[subprocess.Popen[bytes]]
) -> None:
    """From the virtualenv alone: --version is the package's, init writes a starter folder,
    check accepts it, and serve (SQLite in that folder) with the demo provider takes a job
    from submit to succeeded; the audit chain in the folder verifies."""
    version = venv.run("statusgate", "--version")
    assert version.stdout.strip() == f"statusgate {__version__}", version.stderr
    where = venv.run("python", "-c", "import gateway; print(gateway.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(venv.root), where

    folder = venv.home / "starter"
    init = venv.run("statusgate", "init", str(folder))
    assert init.returncode == 0, init.stderr
    assert f"statusgate check --config {folder / 'gateway.yaml'}" in init.stdout
    assert f"-m gateway.demo.env --export {folder / 'policies'}" in init.stdout
    token = re.search(r"^Agent token \(shown once[^)]*\): (\S+)$", init.stdout, re.MULTILINE)
    assert token, init.stdout
    again = venv.run("statusgate", "init", str(folder))
    assert again.returncode == 1 and "exists (--force replaces it)" in again.stderr

    # what the printed eval line sets: every key the policies read, as the demo provider's
    keys = venv.run("python", "-m", "gateway.demo.env", str(folder / "policies"))
    env = dict(line.split("=", 1) for line in keys.stdout.splitlines())
    assert env.get("DEMO_API_KEY") == "demo-provider-key", keys
    # the demo's key alone loads only the demo's policies: check names each other variable
    alone = venv.run(
        "statusgate", "check", "--config", str(folder / "gateway.yaml"), DEMO_API_KEY="k"
    )
    assert alone.returncode == 1
    missing = {
        line.rsplit("/", 1)[-1].split(": ")[0]: line.split("environment variable ")[-1]
        for line in alone.stderr.splitlines()
        if "credential.value: environment variable " in line
    }
    assert missing["anthropic-batches.yaml"] == "ANTHROPIC_API_KEY is not set", alone.stderr
    assert missing["openai-batch.yaml"] == "OPENAI_API_KEY is not set", alone.stderr
    assert "demo-jobs.yaml" not in missing and "DEMO_API_KEY" not in alone.stderr
    assert set(env) - {"DEMO_API_KEY"} <= set(alone.stderr.split()), alone.stderr
    port, demo_port = free_port(), free_port()
    config = folder / "gateway.yaml"
    text = config.read_text()
    assert "port: 8080" in text and "127.0.0.1:8081/{provider}" in text
    text = text.replace("port: 8080", f"port: {port}").replace(":8080", f":{port}")
    config.write_text(text.replace(":8081/", f":{demo_port}/"))

    check = venv.run("statusgate", "check", "--config", str(config), **env)
    assert check.returncode == 0, check.stderr
    assert f"ok: {len(POLICIES)} policies" in check.stdout and "store sqlite" in check.stdout

    demo_log, serve_log = venv.home / "demo.log", venv.home / "serve.log"
    demo = start(venv, started, demo_log, "demo-provider", "--port", str(demo_port), env=env)
    serve = start(venv, started, serve_log, "serve", "--config", str(config), env=env)
    wait_for_health(f"http://127.0.0.1:{demo_port}/_demo/log", demo, demo_log)
    wait_for_health(f"http://127.0.0.1:{port}/healthz", serve, serve_log)

    auth = {"Authorization": f"Bearer {token.group(1)}"}
    status, headers, body = call(
        f"http://127.0.0.1:{port}/p/demo-jobs/v1/jobs",
        {"input": "report.pdf", "demo_script": [{"state": "running"}, {"state": "succeeded"}]},
        {**auth, "Idempotency-Key": "from-the-wheel"},
    )
    assert status == 202, body
    job, operation = json.loads(body)["id"], headers["Statusgate-Operation"]
    state, deadline = "queued", time.monotonic() + 180
    while state != "succeeded" and time.monotonic() < deadline:
        status, headers, body = call(
            f"http://127.0.0.1:{port}/p/demo-jobs/v1/jobs/{job}",
            None,
            {**auth, "Prefer": "wait=30"},
        )
        if status == 429:  # too early: come back when told
            time.sleep(max(1.0, float(headers.get("Retry-After", "1"))))
            continue
        assert status == 200, body
        state = json.loads(body)["state"]
    assert state == "succeeded"

    assert (folder / "statusgate.db").is_file()
    verify = venv.run("statusgate", "audit", "verify", str(folder / "audit.jsonl"))
    assert verify.returncode == 0 and "chain intact" in verify.stdout, verify
    story = venv.run("statusgate", "audit", "story", "--config", str(config), operation)
    assert "finished: succeeded" in story.stdout, story


def test_the_wheel_alone_runs_the_demo_of_a_shipped_policy(venv: Venv) -> None:
    """`statusgate demo --provider replicate` from the virtualenv, outside the checkout, finds
    the wheel's copy of the policy and shows its job to the end."""
    demo = venv.run("statusgate", "demo", "--provider", "replicate")
    assert demo.returncode == 0, demo.stderr
    assert "finished: succeeded" in demo.stdout
