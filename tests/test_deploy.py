"""The shipped operations files (SPEC 13; docs/runbooks.md): alert rules, the Grafana
dashboard, the image's lock file, .dockerignore and health check, and a real Prometheus
evaluating the rules while it scrapes a real `statusgate serve` process. Everything listens on
loopback only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_client.parser import text_string_to_metric_families

from conftest import (
    AGENT_TOKEN,
    PROVIDER_ENV,
    ROOT,
    free_port,
    wait_until_up,
    write_config,
)

DEPLOY = ROOT / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts.test.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "statusgate.json"
HEALTHCHECK = DEPLOY / "docker" / "healthcheck.py"
LOCK = ROOT / "requirements.lock"

# The names the gateway exports (docs/reference.md, Metrics).
HISTOGRAMS = {
    "statusgate_upstream_request_duration_seconds",
    "statusgate_request_duration_seconds",
    "statusgate_status_requests_per_operation",
}
SAMPLES = {
    "statusgate_agent_requests_total",
    "statusgate_upstream_requests_total",
    "statusgate_operations_started_total",
    "statusgate_operations_finished_total",
    "statusgate_escalations_total",
    "statusgate_operations_active",
    "statusgate_provider_guidance_total",
    "statusgate_store_errors_total",
    "statusgate_escalations_open",
    "statusgate_build_info",
    "statusgate_webhook_deliveries_total",
    "statusgate_config_reloads_total",
    "statusgate_overloaded_requests_total",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
}
KNOWN = SAMPLES | {f"{h}{end}" for h in HISTOGRAMS for end in ("_bucket", "_sum", "_count")}
KNOWN_WITH_UP = KNOWN | {"up"}  # `up` is Prometheus' own, per scrape target

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_WORDS |= {"and", "or", "unless", "offset", "inf", "nan"}
LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENTIFIER = re.compile(r"(?<![\w.$:])[A-Za-z_:][\w:]*")
LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = LABEL_LISTS.sub("", expr)
    names = set()
    for match in IDENTIFIER.finditer(expr):
        word = match.group()
        if expr[match.end() :].lstrip().startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) for every query target."""
    return [
        (panel["title"], target["expr"])
        for panel in panels(dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def test_metric_names_reads_promql_as_prometheus_does() -> None:
    """The name extractor the checks below rely on skips functions, labels, ranges and keywords."""
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{job=~"$job", x="y{z}"}'
        "[$__rate_interval]))) / on (route) group_left b unless c offset 5m > bool 1e3"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c"}


# --- alert rules ---------------------------------------------------------------------------


def test_alert_rules_are_one_statusgate_group_of_alerts() -> None:
    """alerts.yaml parses into the single group "statusgate", and every rule is an alert."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert [group["name"] for group in groups] == ["statusgate"]
    assert rules() and all("alert" in rule and "record" not in rule for rule in rules())


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    """Every alert carries severity warning or critical and non-empty summary and description."""
    for rule in rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]


def test_every_alert_has_a_runbook_section_that_exists() -> None:
    """Every alert's runbook_url names a section of docs/runbooks.md that is there."""
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")}
    for rule in rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks.md" and anchor in anchors, (rule["alert"], url)
        assert anchor == rule["alert"].lower()


def test_alert_expressions_use_only_exported_metrics() -> None:
    """Every alert expression selects only metrics the gateway exports, or Prometheus' `up`."""
    unknown = {rule["alert"]: metric_names(rule["expr"]) - KNOWN_WITH_UP for rule in rules()}
    assert not {alert: names for alert, names in unknown.items() if names}


def test_spec_alerts_are_shipped() -> None:
    """The alerts SPEC 13 and operators ask for exist, with a critical one for long waits."""
    shipped = {(rule["alert"], rule["labels"]["severity"]) for rule in rules()}
    for needed in [
        ("StatusgateDown", "critical"),
        ("StatusgateEscalationsWaiting", "warning"),
        ("StatusgateEscalationsWaiting", "critical"),
        ("StatusgateEscalationsBacklog", "critical"),
        ("StatusgateStoreErrors", "warning"),
        ("StatusgateProviderFailing", "warning"),
        ("StatusgateWebhookFailing", "warning"),
        ("StatusgateConfigReloadFailed", "warning"),
        ("StatusgateOverloaded", "warning"),
    ]:
        assert needed in shipped


def test_every_alert_has_unit_tests_that_fire_it_and_keep_it_silent() -> None:
    """alerts.test.yaml expects each alert (each severity) firing once and silent once."""
    firing: set[tuple[str, str]] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            expected = check.get("exp_alerts") or []
            if not expected:
                silent.add(check["alertname"])
            firing |= {(check["alertname"], alert["exp_labels"]["severity"]) for alert in expected}
    assert firing == {(rule["alert"], rule["labels"]["severity"]) for rule in rules()}
    assert silent == {rule["alert"] for rule in rules()}


def test_example_prometheus_config_scrapes_the_job_the_alerts_select() -> None:
    """prometheus.yml loads alerts.yaml and names its scrape job as `up{job=...}` expects."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert [PROMETHEUS_CONFIG.parent / path for path in config["rule_files"]] == [ALERTS]
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert jobs == ["statusgate"]
    assert 'up{job="statusgate"}' in ALERTS.read_text()


# --- dashboard -----------------------------------------------------------------------------


def test_dashboard_is_grafana_json_on_a_datasource_variable() -> None:
    """The dashboard is a recent Grafana model whose every query uses the datasource variable."""
    board = dashboard()
    assert board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(board["panels"])]
    assert len(ids) == len(set(ids))
    for panel in panels(board["panels"]):
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_queries_use_only_exported_metrics() -> None:
    """Every panel query and template variable names only metrics the gateway exports."""
    unknown = [
        (title, metric_names(expr) - KNOWN_WITH_UP)
        for title, expr in dashboard_exprs()
        if metric_names(expr) - KNOWN_WITH_UP
    ]
    for var in dashboard()["templating"]["list"]:
        for name in LABEL_VALUES.findall(str(var.get("query", ""))):
            if name not in KNOWN:
                unknown.append((var["name"], {name}))
    assert not unknown


def test_dashboard_shows_every_statusgate_metric() -> None:
    """Each statusgate_* metric of SPEC 9 and 13 appears in at least one panel."""
    shown = {name for _, expr in dashboard_exprs() for name in metric_names(expr)}
    shown |= {name.removesuffix(end) for name in shown for end in ("_bucket", "_sum", "_count")}
    spec = {name for name in SAMPLES | HISTOGRAMS if name.startswith("statusgate_")}
    assert spec - shown == set()


# --- image -----------------------------------------------------------------------------------


def test_lock_pins_every_runtime_dependency_within_pyproject_ranges() -> None:
    """requirements.lock pins (==) every [project] dependency at a version pyproject allows."""
    lines = [line.strip() for line in LOCK.read_text().splitlines()]
    pins = [Requirement(line) for line in lines if line and not line.startswith("#")]
    pinned = {}
    for pin in pins:
        (spec,) = pin.specifier
        assert spec.operator == "==", str(pin)
        pinned[canonicalize_name(pin.name)] = spec.version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        needed = Requirement(line)
        name = canonicalize_name(needed.name)
        assert name in pinned, f"{needed.name} is not in requirements.lock: run make lock"
        assert needed.specifier.contains(pinned[name]), f"{name}=={pinned[name]} vs {needed}"


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule for one path: the last matching pattern wins, `!` re-includes."""
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if re.fullmatch(rf"{regex}(?:/.*)?", path):
            excluded = not negated
    return excluded


def test_dockerfile_copies_only_files_that_exist_and_the_context_keeps() -> None:
    """Every COPY source exists and .dockerignore leaves it in while var/ and .venv stay out."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [
        source
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert "requirements.lock" in sources and "deploy/docker/healthcheck.py" in sources
    build_script = (ROOT / "deploy/image/build.sh").read_text()
    for source in sources:
        if source.startswith("build/image/"):
            # made by deploy/image/build.sh (make image) just before the build, not checked in
            assert f"{source}" in build_script, source
        else:
            assert (ROOT / source).exists(), source
        assert not dockerignore_excludes(source, patterns), source
    for secret in ["var/statusgate.db", ".venv/bin/python", ".git/config", "tests/conftest.py"]:
        assert dockerignore_excludes(secret, patterns), secret


def test_image_runs_as_a_numeric_non_root_user_with_a_healthcheck() -> None:
    """The Dockerfile switches to a numeric non-root user and checks health with the script."""
    text = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0"
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD .*statusgate-healthcheck", text, re.MULTILINE)
    assert "-r requirements.lock" in text


# --- a real gateway, a real Prometheus -------------------------------------------------------


def fetch(url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One loopback HTTP call (POST with a JSON ``body``, else GET): status and body."""
    data = None if body is None else json.dumps(body).encode()
    headers = {**(headers or {}), **({"Content-Type": "application/json"} if data else {})}
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (loopback)
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read()


def http_get(url: str) -> bytes:
    """The body of a GET that must answer 200."""
    status, body = fetch(url)
    assert status == 200, (url, status, body[:200])
    return body


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def until(condition: Callable[[], Any], deadline: float, what: str) -> Any:
    """Poll ``condition`` every 0.2 s until it returns something truthy or ``deadline``
    (a time.monotonic() instant) passes."""
    while time.monotonic() < deadline:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


@dataclass
class Gateway:
    port: int
    config: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """`statusgate serve` on SQLite in front of the demo provider, both real processes, after
    one submit and one status call so provider series have samples."""
    folder = tmp_path_factory.mktemp("deploy-gateway")
    env = {**os.environ, **PROVIDER_ENV}
    provider_port, port = free_port(), free_port()
    started: list[subprocess.Popen[bytes]] = []
    logs = (folder / "stderr.log").open("wb")
    try:
        command = [
            sys.executable,
            "-m",
            "gateway.run",
            "demo-provider",
            "--port",
            str(provider_port),
        ]
        started.append(subprocess.Popen(command, env=env, stdout=logs, stderr=logs))
        wait_until_up(provider_port, started[-1])
        config = write_config(
            folder,
            f"http://127.0.0.1:{provider_port}",
            store=f"sqlite:///{folder / 'gateway.db'}",
            config_changes={"listen": {"port": port}},
        )
        command = [sys.executable, "-m", "gateway.run", "serve", "--config", str(config)]
        started.append(subprocess.Popen(command, env=env, stdout=logs, stderr=logs))
        wait_until_up(port, started[-1])
        served = Gateway(port, config)
        submit_and_poll(served)
        yield served
    finally:
        for process in reversed(started):
            stop(process)
        logs.close()


def submit_and_poll(gateway: Gateway) -> None:
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    jobs = f"{gateway.url}/p/demo-jobs/v1/jobs"
    status, body = fetch(jobs, {"input": "report.pdf"}, {**auth, "Idempotency-Key": "deploy-1"})
    assert status in (200, 201, 202), (status, body)
    status, _ = fetch(f"{jobs}/{json.loads(body)['id']}", headers=auth)
    assert status in (200, 429), status  # a call before next_poll_at is refused and counted


@dataclass
class Prometheus:
    url: str

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        answer = json.loads(http_get(f"{self.url}/api/v1/{path}{query}"))
        assert answer["status"] == "success", answer
        return answer["data"]

    def rules(self) -> list[dict[str, Any]]:
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, gateway: Gateway) -> Iterator[Prometheus]:
    """A real Prometheus on loopback with the shipped prometheus.yml and alerts.yaml, scraping
    and evaluating every second, after it has scraped the gateway and evaluated the rules."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not on PATH (apt-get install prometheus): live rules skipped")
    folder = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"] = {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": "1s",
    }
    config["rule_files"] = [str(ALERTS)]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{gateway.port}"]}]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    logs = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=logs,
        stderr=logs,
    )
    try:
        deadline = time.monotonic() + 20  # for all of it: start, ready, scrapes, evaluation
        wait_until_up(port, process)
        server = Prometheus(f"http://127.0.0.1:{port}")
        ready = f"{server.url}/-/ready"
        until(lambda: fetch(ready)[0] == 200, deadline, "Prometheus to be ready")
        until(lambda: scraped_twice(server), deadline, "two scrapes of the gateway")
        seen = group_evaluated_at(server)
        until(lambda: group_evaluated_at(server) != seen, deadline, "a rule evaluation")
        yield server
    finally:
        stop(process)
        logs.close()


def scraped_twice(server: Prometheus) -> bool:
    """Two successful scrapes: enough samples for rate() and increase() to answer."""
    query = 'sum_over_time(up{job="statusgate"}[1m]) >= 2'
    return bool(server.api("query", query=query)["result"])


def group_evaluated_at(server: Prometheus) -> str:
    (group,) = server.api("rules")["groups"]
    evaluated: str = group["lastEvaluation"]
    return evaluated


def test_prometheus_evaluates_every_shipped_rule_without_error(prometheus: Prometheus) -> None:
    """Prometheus loaded every rule of alerts.yaml and evaluated each one with health ok."""
    loaded = prometheus.rules()
    assert [(rule["name"], rule["labels"]["severity"]) for rule in loaded] == [
        (rule["alert"], rule["labels"]["severity"]) for rule in rules()
    ]
    for rule in loaded:
        assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), rule["name"]


def test_a_healthy_idle_gateway_raises_no_alert(prometheus: Prometheus) -> None:
    """Against a fresh gateway with nothing wrong, no alert is pending or firing."""
    states = [
        (rule["name"], rule["labels"]["severity"], rule["state"]) for rule in prometheus.rules()
    ]
    assert states == [(rule["alert"], rule["labels"]["severity"], "inactive") for rule in rules()]


def test_every_dashboard_query_runs_on_prometheus(prometheus: Prometheus) -> None:
    """Each panel query, with Grafana's variables filled in, is valid PromQL for Prometheus."""
    variables = {"$__rate_interval": "1m", "$job": "statusgate", "$instance": ".*"}
    variables["$provider"] = ".*"
    for title, expr in dashboard_exprs():
        for name, value in variables.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, title
        prometheus.api("query", query=expr)  # raises unless status is success


def test_dashboard_panels_show_the_scraped_gateway(prometheus: Prometheus) -> None:
    """The key panels have data from the real gateway: requests, operations and escalations."""
    for expr in [
        'sum by (outcome) (rate(statusgate_agent_requests_total{job="statusgate"}[1m]))',
        'max by (provider) (statusgate_operations_active{job="statusgate"})',
        'max by (provider, reason) (statusgate_escalations_open{job="statusgate"})',
        'count by (version) (statusgate_build_info{job="statusgate"})',
    ]:
        assert prometheus.api("query", query=expr)["result"], expr


def test_dashboard_variables_list_the_scraped_gateway(
    prometheus: Prometheus, gateway: Gateway
) -> None:
    """The job, instance and provider variables' label_values queries find the gateway."""
    expected = {
        "job": "statusgate",
        "instance": f"127.0.0.1:{gateway.port}",
        "provider": "demo-jobs",
    }
    variables = {var["name"]: var for var in dashboard()["templating"]["list"]}
    for name, value in expected.items():
        query = variables[name]["query"].replace("$job", "statusgate")
        found = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
        assert found and found.group(2) == name, query
        path = f"label/{name}/values?{urllib.parse.urlencode({'match[]': found.group(1)})}"
        assert value in prometheus.api(path), (name, query)


def test_gateway_exports_every_metric_the_operations_files_use(gateway: Gateway) -> None:
    """/metrics of a real gateway has every name the alerts and dashboard select, and the
    counters that alerts watch for single events start at 0 (so increase() sees the first)."""
    families = list(text_string_to_metric_families(http_get(f"{gateway.url}/metrics").decode()))
    samples = {(s.name, tuple(sorted(s.labels.items()))) for f in families for s in f.samples}
    exported = {name for name, _ in samples}
    # A labelled counter with no child yet (store errors before the first) has no samples.
    exported |= {f"{f.name}_total" for f in families if f.type == "counter"}
    used = {name for rule in rules() for name in metric_names(rule["expr"])}
    used |= {name for _, expr in dashboard_exprs() for name in metric_names(expr)}
    assert used - exported - {"up"} == set()
    for result in ["failed", "dropped"]:
        assert ("statusgate_webhook_deliveries_total", (("result", result),)) in samples
    assert ("statusgate_config_reloads_total", (("result", "error"),)) in samples


def run_healthcheck(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STATUSGATE_CONFIG": str(config), **PROVIDER_ENV}
    command = [sys.executable, str(HEALTHCHECK)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=20)


def test_image_healthcheck_finds_the_port_in_the_config(gateway: Gateway, tmp_path: Path) -> None:
    """The HEALTHCHECK script passes against the config's port and fails, saying why, when
    nothing listens there or the config cannot be read."""
    assert run_healthcheck(gateway.config).returncode == 0
    port = free_port()  # nothing listens there
    dead = write_config(tmp_path, gateway.url, config_changes={"listen": {"port": port}})
    refused = run_healthcheck(dead)
    assert refused.returncode == 1 and f"127.0.0.1:{port}/healthz" in refused.stderr
    missing = run_healthcheck(tmp_path / "absent.yaml")
    assert missing.returncode == 1 and "absent.yaml" in missing.stderr


def test_make_run_installs_the_runtime_and_a2a_and_make_test_the_dev_stack(tmp_path: Path) -> None:
    """`make run` installs the package with its a2a extra (the demo A2A agent), pinned by
    requirements.lock, under a stamp of its own; `make test` installs the dev extra (dry
    runs on a venv that does not exist)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = f"VENV={tmp_path / 'venv'}"

    def installs(target: str) -> list[str]:
        done = subprocess.run(
            ["make", "-n", target, venv], cwd=ROOT, capture_output=True, text=True, check=True
        )
        return [line for line in done.stdout.splitlines() if "pip install" in line]

    run = installs("run")
    assert any("-c requirements.lock -e '.[a2a]'" in line for line in run), run
    assert not any("[dev]" in line for line in run), run
    assert any("'.[dev]'" in line for line in installs("test"))
