"""The Kubernetes manifests (docs/kubernetes.md): every overlay of deploy/kubernetes, alone,
with the production components and with the demo, rendered by `kubectl kustomize`, linted by
yamllint, validated strictly and offline against the Kubernetes 1.32 schemas (the Prometheus
Operator's objects against their CRD schemas, shipped in tests/data/kubernetes), checked rule
by rule, and the configuration each container mounts loaded by the command it runs with
placeholder secrets.

Without kubectl the rendering tests skip, naming what to install; `.ci/run` sets
STATUSGATE_REQUIRE_KUBECTL=1 so that in CI they fail instead.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import aiohttp
import jsonschema
import kubernetes_validate
import pytest
import yaml
from aiohttp import web
from yamllint import config as yamllint_config
from yamllint import linter

from conftest import AGENT_TOKEN, PROVIDER_KEY, ROOT, drop_schema, free_port, sha, wait_until_up

KUBE = ROOT / "deploy" / "kubernetes"
POLICIES = ROOT / "policies"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
CRDS = Path(__file__).parent / "data" / "kubernetes"
KUBERNETES_VERSION = "1.32"
OVERLAYS = ("sqlite", "redis", "postgres")
REPLICATED = ("redis", "postgres")
COMPONENTS = ("servicemonitor", "networkpolicy", "ingress")  # production, tried together
DEMO = ("demo",)  # a first try only: demo provider, example policies, demo account
TLS = (*COMPONENTS, "tls")  # production with the gateway speaking TLS behind the Ingress
LISTENER_TLS = "statusgate-listener-tls"  # the Secret components/tls mounts
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
CRD_GROUP = "monitoring.coreos.com"
MIGRATE = "statusgate migrate --config /etc/statusgate-migrate/gateway.yaml"

KUBECTL = shutil.which("kubectl")
REQUIRED = os.environ.get("STATUSGATE_REQUIRE_KUBECTL") == "1"
NO_KUBECTL = (
    "kubectl is not on PATH: install kubectl 1.32 or newer (kustomize v5 inside) to render "
    "deploy/kubernetes; .ci/run requires it"
)

# What a Secret holds in production, a placeholder here (kind of value, never a real one).
PLACEHOLDER_SECRETS = {
    ("statusgate-secrets", "agent-token-sha256"): hashlib.sha256(b"agent").hexdigest(),
    ("statusgate-secrets", "operator-token-sha256"): hashlib.sha256(b"operator").hexdigest(),
    ("statusgate-secrets", "audit-hmac-key"): "placeholder-audit-hmac-key",
    ("statusgate-secrets", "demo-api-key"): "placeholder-provider-key",
}
PLACEHOLDER_STORES = {
    "redis": "redis://redis:6379/0?prefix=statusgate",
    "postgres": "postgresql://statusgate:placeholder@postgres:5432/statusgate",
}
# Environment variables a manifest may set literally: none of them is a secret.
NOT_SECRET = {"POD_NAME", "STATUSGATE_CONFIG"}
WILDCARD = {"0.0.0.0", "::"}  # noqa: S104 (names the wildcard, binds nothing)
# ${NAME}; one with a default (${NAME:-default}) needs no variable, and is not matched
INTERPOLATED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Rendered output is kustomize's, not ours: only what would make it wrong YAML counts.
RENDERED_LINT = yamllint_config.YamlLintConfig(
    "extends: default\n"
    "rules: {line-length: disable, document-start: disable, indentation: {indent-sequences: "
    "whatever}, comments: disable, comments-indentation: disable, truthy: {check-keys: false}}\n"
)


@dataclass(frozen=True)
class Rendered:
    """One variant: an overlay, alone or with components, as `kubectl kustomize` prints it."""

    overlay: str
    components: tuple[str, ...]
    text: str
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.objects if item["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        (item,) = self.of_kind(kind)
        return item

    @property
    def workload(self) -> dict[str, Any]:
        (item,) = [item for item in self.objects if item["kind"] in WORKLOAD_KINDS]
        return item

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.workload["spec"]["template"]["spec"]
        return spec

    @property
    def gateway(self) -> dict[str, Any]:
        """The main container: the one running `statusgate serve`."""
        (container,) = [c for c in self.pod["containers"] if c.get("args", [])[:1] == ["serve"]]
        return container

    def containers(self) -> list[dict[str, Any]]:
        """Every container, init containers included."""
        return [*self.pod.get("initContainers", []), *self.pod["containers"]]

    def config_map(self, name: str) -> dict[str, Any]:
        (item,) = [c for c in self.of_kind("ConfigMap") if c["metadata"]["name"] == name]
        return item

    def mounted_files(self, container: dict[str, Any]) -> dict[str, str]:
        """Every file the container sees from a ConfigMap volume: absolute path -> text."""
        volumes = {volume["name"]: volume for volume in self.pod.get("volumes", [])}
        files = {}
        for mount in container.get("volumeMounts", []):
            source = volumes.get(mount["name"], {}).get("configMap")
            if source is None:
                continue
            assert "items" not in source and "subPath" not in mount, mount["name"]
            for key, text in self.config_map(source["name"]).get("data", {}).items():
                files[f"{mount['mountPath'].rstrip('/')}/{key}"] = text
        return files

    def config_path(self, container: dict[str, Any]) -> str:
        args = container["args"]
        return str(args[args.index("--config") + 1])

    def mounted_config(self, container: dict[str, Any] | None = None) -> dict[str, Any]:
        """The config a container (the main one unless named) is started with, parsed."""
        container = self.gateway if container is None else container
        text = self.mounted_files(container)[self.config_path(container)]
        data: dict[str, Any] = yaml.safe_load(text)
        return data

    @property
    def demo(self) -> bool:
        return "demo" in self.components

    def mounted_policies(self) -> dict[str, str]:
        """The policy files the main container sees in its policies_dir: name -> text."""
        folder = PurePosixPath(
            os.path.normpath(
                PurePosixPath(self.config_path(self.gateway)).parent
                / self.mounted_config()["policies_dir"]
            )
        )
        return {
            PurePosixPath(path).name: text
            for path, text in self.mounted_files(self.gateway).items()
            if PurePosixPath(path).parent == folder
        }


def render(target: Path) -> str:
    if KUBECTL is None:
        pytest.fail(NO_KUBECTL) if REQUIRED else pytest.skip(NO_KUBECTL)
    done = subprocess.run(
        [KUBECTL, "kustomize", str(target)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize {target}:\n{done.stderr}"
    return done.stdout


def with_components(overlay: str, components: tuple[str, ...], folder: Path) -> Path:
    """A kustomization as a platform team writes one: an overlay plus components."""
    folder.mkdir(parents=True, exist_ok=True)
    relative = Path(os.path.relpath(KUBE, folder))
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(relative / "overlays" / overlay)],
                "components": [str(relative / "components" / name) for name in components],
            }
        )
    )
    return folder


VARIANTS: list[tuple[str, tuple[str, ...]]] = [
    *[(overlay, ()) for overlay in OVERLAYS],
    *[(overlay, COMPONENTS) for overlay in OVERLAYS],
    ("sqlite", DEMO),
    ("postgres", DEMO),
    ("redis", TLS),
]


def variant_id(variant: tuple[str, tuple[str, ...]]) -> str:
    return "+".join([variant[0], *variant[1]])


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Rendered]:
    out = {}
    for overlay, components in VARIANTS:
        target = KUBE / "overlays" / overlay
        if components:
            folder = tmp_path_factory.mktemp(f"k8s-{overlay}")
            target = with_components(overlay, components, folder)
        text = render(target)
        objects = [item for item in yaml.safe_load_all(text) if item]
        out[overlay, components] = Rendered(overlay, components, text, objects)
    return out


@pytest.fixture(params=VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def rendered(request: pytest.FixtureRequest, renders: dict[Any, Rendered]) -> Rendered:
    return renders[request.param]


PRODUCTION = [variant for variant in VARIANTS if variant[1] != DEMO]


@pytest.fixture(params=PRODUCTION, ids=[variant_id(v) for v in PRODUCTION])
def production(request: pytest.FixtureRequest, renders: dict[Any, Rendered]) -> Rendered:
    """One variant without the demo: what a platform team deploys."""
    return renders[request.param]


@pytest.fixture(params=REPLICATED)
def replicated(request: pytest.FixtureRequest, renders: dict[Any, Rendered]) -> Rendered:
    return renders[request.param, ()]


@pytest.fixture(params=OVERLAYS)
def monitored(request: pytest.FixtureRequest, renders: dict[Any, Rendered]) -> Rendered:
    """One overlay with the servicemonitor and networkpolicy components."""
    return renders[request.param, COMPONENTS]


def package_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def env_sources(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def config_loaders(rendered: Rendered) -> list[dict[str, Any]]:
    """Containers that load the gateway config (serve, migrate, ...): they take --config."""
    return [c for c in rendered.containers() if "--config" in c.get("args", [])]


def interpolated_names(rendered: Rendered, container: dict[str, Any]) -> set[str]:
    """Every ${NAME} the container's mounted config and policies read, and its audit key
    variable."""
    names = set()
    for text in rendered.mounted_files(container).values():
        for line in text.splitlines():
            if not line.lstrip().startswith("#"):
                names.update(INTERPOLATED.findall(line))
    key_env = (rendered.mounted_config(container).get("audit") or {}).get("hmac_key_env")
    return names | ({key_env} if key_env else set())


def port_number(container: dict[str, Any], port: int | str) -> int:
    """A container port by name or number, as a number."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    return int(number)


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


# --- the tree itself ---------------------------------------------------------------------------


def test_policies_kustomization_lists_every_shipped_policy() -> None:
    """policies/Kustomization puts exactly the policy files of policies/ in the ConfigMap."""
    (generator,) = yaml.safe_load((POLICIES / "Kustomization").read_text())["configMapGenerator"]
    shipped = sorted(p.name for p in [*POLICIES.glob("*.yaml"), *POLICIES.glob("*.yml")])
    assert generator["name"] == "statusgate-policies"
    assert sorted(generator["files"]) == shipped


def test_prometheus_rule_is_generated_from_the_shipped_alerts() -> None:
    """The PrometheusRule carries alerts.yaml's groups unchanged, as the generator writes it."""
    sys.path.insert(0, str(KUBE))
    try:
        import prometheusrule  # deploy/kubernetes/prometheusrule.py
    finally:
        sys.path.remove(str(KUBE))
    shipped = KUBE / "components" / "servicemonitor" / "prometheusrule.yaml"
    rule = yaml.safe_load(shipped.read_text())
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    assert shipped.read_text() == prometheusrule.render(), "run make kubernetes-rules"


def test_image_tag_in_the_manifests_is_the_package_version() -> None:
    """base/kustomization.yaml names the image once, tagged with pyproject.toml's version,
    and `make image` builds that same name and tag."""
    kustomization = yaml.safe_load((KUBE / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["newTag"] == package_version()
    make = subprocess.run(
        ["make", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    # deploy/image/build.sh IMAGE VERSION tags IMAGE:VERSION and passes VERSION to the build
    assert f"deploy/image/build.sh {image['newName']} {package_version()}\n" in make.stdout
    script = (ROOT / "deploy/image/build.sh").read_text()
    assert 'tag="$image:$version"' in script and '"VERSION=$version"' in script


def test_dockerfile_refuses_a_version_other_than_the_package_one() -> None:
    """The image build checks that its VERSION is the installed package's version."""
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG VERSION", text, re.MULTILINE)
    assert 'test "$(statusgate --version)" = "statusgate ${VERSION}"' in text


def test_source_manifests_pass_yamllint() -> None:
    """Every YAML file under deploy/kubernetes passes yamllint with deploy/kubernetes/.yamllint."""
    conf = yamllint_config.YamlLintConfig(file=str(KUBE / ".yamllint"))
    files = [*KUBE.rglob("*.yaml"), POLICIES / "Kustomization"]
    problems = [
        f"{path.relative_to(ROOT)}:{p.line}: {p.desc}"
        for path in files
        for p in linter.run(path.read_text(), conf, str(path))
        if p.level == "error"
    ]
    assert not problems


def test_validation_is_offline_and_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate needs no network and rejects a field Kubernetes does not know."""

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("kubernetes-validate tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80}]},
    }
    assert kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)
    service["spec"]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)


def strict_crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema with unknown fields refused, as `kubectl apply` does
    (field validation Strict) instead of pruning them silently. Patterns are Go's (RE2):
    an inline flag such as ``^(?i)...`` moves to the front, where Python accepts it."""
    doc = json.loads((CRDS / f"{kind.lower()}.v1.json").read_text())
    schema: dict[str, Any] = copy.deepcopy(doc["openAPIV3Schema"])

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            pattern = node.get("pattern")
            if isinstance(pattern, str) and "(?i)" in pattern[1:]:
                node["pattern"] = "(?i)" + pattern.replace("(?i)", "")
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def test_crd_schemas_refuse_unknown_fields() -> None:
    """The shipped ServiceMonitor schema accepts a valid object and refuses a misspelt field."""
    schema = strict_crd_schema("ServiceMonitor")
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "admin"}]},
    }
    jsonschema.validate(monitor, schema)
    monitor["spec"]["endpoints"][0]["prot"] = "admin"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, schema)


# --- every variant: render, lint, validate -----------------------------------------------------


def test_renders_to_yaml_that_passes_yamllint(rendered: Rendered) -> None:
    """`kubectl kustomize` output has no YAML error (duplicate keys, bad indentation, ...)."""
    problems = [
        f"{p.line}: {p.desc}"
        for p in linter.run(rendered.text, RENDERED_LINT)
        if p.level == "error"
    ]
    assert not problems


def test_validates_against_kubernetes_schemas(rendered: Rendered) -> None:
    """Every object validates strictly against Kubernetes 1.32, and the Prometheus Operator's
    objects against their CRD schemas; nothing else is left unvalidated."""
    for item in rendered.objects:
        where = f"{item['kind']}/{item['metadata']['name']}"
        if item["apiVersion"].split("/")[0] == CRD_GROUP:
            try:
                jsonschema.validate(item, strict_crd_schema(item["kind"]))
            except jsonschema.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message} at {list(exc.absolute_path)}")
            continue
        try:
            kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {list(exc.absolute_path)}")


def test_components_add_only_their_objects(renders: dict[Any, Rendered]) -> None:
    """The components add a ServiceMonitor, a PrometheusRule, a NetworkPolicy and an
    Ingress, nothing else, and no overlay has them on its own (each is opt-in)."""
    for name in OVERLAYS:
        alone = {(o["kind"], o["metadata"]["name"]) for o in renders[name, ()].objects}
        more = {(o["kind"], o["metadata"]["name"]) for o in renders[name, COMPONENTS].objects}
        assert {kind for kind, _ in more - alone} == {
            "ServiceMonitor",
            "PrometheusRule",
            "NetworkPolicy",
            "Ingress",
        }
        assert alone < more


# --- SPEC 19, rule by rule ---------------------------------------------------------------------


def test_one_workload_runs_statusgate_serve(rendered: Rendered) -> None:
    """Exactly one Deployment or StatefulSet, whose main container runs `statusgate serve`
    (the image's entrypoint) with the mounted config."""
    entrypoint = re.search(r'^ENTRYPOINT \["(\w+)"\]', (ROOT / "Dockerfile").read_text(), re.M)
    assert entrypoint and entrypoint.group(1) == "statusgate"
    assert "command" not in rendered.gateway
    assert rendered.gateway["args"] == ["serve", "--config", "/etc/statusgate/gateway.yaml"]


def test_a_service_routes_to_the_gateway(rendered: Rendered) -> None:
    """The Service selects the workload's pods and targets the ports of both listeners."""
    service = rendered.one("Service")
    labels = rendered.workload["spec"]["template"]["metadata"]["labels"]
    assert labels_match(service["spec"]["selector"], labels)
    config = rendered.mounted_config()
    targets = {port_number(rendered.gateway, p["targetPort"]) for p in service["spec"]["ports"]}
    assert targets == {config["listen"]["port"], config["admin_listen"]["port"]}


def test_config_and_policies_come_from_configmaps(rendered: Rendered) -> None:
    """gateway.yaml and the policies are mounted read-only from ConfigMaps, the policies
    where the config's policies_dir says: none without the demo, every shipped example
    policy, unchanged, with it."""
    assert rendered.config_path(rendered.gateway) in rendered.mounted_files(rendered.gateway)
    shipped = {p.name: p.read_text() for p in [*POLICIES.glob("*.yaml"), *POLICIES.glob("*.yml")]}
    assert rendered.mounted_policies() == (shipped if rendered.demo else {})
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    for container in rendered.containers():
        for mount in container.get("volumeMounts", []):
            if "configMap" in volumes.get(mount["name"], {}):
                assert mount.get("readOnly") is True, mount["name"]


def test_base_ships_no_demo(production: Rendered) -> None:
    """Without components/demo nothing of the demo is deployed: no policy (so no plain-HTTP
    loopback upstream), no account allowed every provider, no demo provider container and
    no demo provider key; the one account names its providers, none."""
    rendered = production
    assert rendered.mounted_policies() == {}
    accounts = rendered.mounted_config()["accounts"]
    assert accounts and all(account["providers"] == [] for account in accounts)
    assert [c["args"][0] for c in rendered.containers()] == (
        ["migrate", "serve"] if rendered.overlay == "postgres" else ["serve"]
    )
    for container in rendered.containers():
        assert "DEMO_API_KEY" not in env_sources(container), container["name"]
    assert "127.0.0.1:8081" not in rendered.text and "demo-api-key" not in rendered.text


def test_demo_is_the_base_plus_the_demo(renders: dict[Any, Rendered]) -> None:
    """components/demo changes the gateway config only in the account (every provider),
    public_base_url (the port-forward's address) and upstreams (every provider to the
    sidecar), mounts every shipped example policy and gives the gateway the demo provider
    key from the Secret under every name their credentials read, and adds nothing but the
    sidecar to the objects."""
    for overlay in ("sqlite", "postgres"):
        plain, demo = renders[overlay, ()], renders[overlay, DEMO]
        assert [o["kind"] for o in plain.objects] == [o["kind"] for o in demo.objects]
        base, changed = plain.mounted_config(), demo.mounted_config()
        assert [a["providers"] for a in changed["accounts"]] == [["*"]]
        assert changed["public_base_url"] == "http://127.0.0.1:8080"
        assert changed.pop("upstreams") == {"*": "http://127.0.0.1:8081/{provider}"}
        for key in ("accounts", "public_base_url"):
            base.pop(key), changed.pop(key)
        assert base == changed
        assert [a["id"] for a in plain.mounted_config()["accounts"]] == ["agents"]
        policies = [yaml.safe_load(text) for text in demo.mounted_policies().values()]
        names = {n for p in policies for n in INTERPOLATED.findall(json.dumps(p["credential"]))}
        assert "DEMO_API_KEY" in names
        for name in names:
            key = env_sources(demo.gateway)[name]["valueFrom"]["secretKeyRef"]
            assert key == {"name": "statusgate-secrets", "key": "demo-api-key"}, name


def test_secrets_are_secret_references_only(rendered: Rendered) -> None:
    """No Secret is shipped, and every variable a container's mounted config and policies
    read that holds a secret comes from a secretKeyRef, in every container that loads a
    config."""
    assert not rendered.of_kind("Secret")
    plain = {"STATUSGATE_STORE_URL"} if rendered.overlay == "sqlite" else set()
    for container in config_loaders(rendered):
        sources = env_sources(container)
        for name in interpolated_names(rendered, container):
            assert name in sources, f"{container['name']} does not set {name}"
            if name in NOT_SECRET | plain:
                continue
            assert "secretKeyRef" in sources[name].get("valueFrom", {}), name
    for container in rendered.containers():
        assert "envFrom" not in container
        for name, source in env_sources(container).items():
            if name not in NOT_SECRET | plain:
                assert "value" not in source, f"{name} is written in the manifest"


def test_store_url_of_replicated_overlays_is_a_secret(replicated: Rendered) -> None:
    """Redis and PostgreSQL overlays read the store URL (and its password) from a Secret."""
    assert rendered_store_env(replicated)["valueFrom"]["secretKeyRef"] == {
        "name": "statusgate-store",
        "key": "url",
    }


def rendered_store_env(rendered: Rendered) -> dict[str, Any]:
    assert rendered.mounted_config()["store"] == "${STATUSGATE_STORE_URL}"
    return env_sources(rendered.gateway)["STATUSGATE_STORE_URL"]


def test_probes_are_readyz_and_healthz(rendered: Rendered) -> None:
    """Readiness is GET /readyz (fails while the store is unreachable) and liveness
    GET /healthz, both on the agent listener's port."""
    agent_port = rendered.mounted_config()["listen"]["port"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = rendered.gateway[probe]["httpGet"]
        assert get["path"] == path
        assert port_number(rendered.gateway, get["port"]) == agent_port


def test_every_container_has_requests_and_limits(rendered: Rendered) -> None:
    """CPU, memory and ephemeral-storage requests and limits are set on every container,
    init ones included, each limit at least its request; the ephemeral-storage limits of the
    pod's containers hold its emptyDir volumes."""
    sizes = {"cpu": parse_quantity, "memory": parse_quantity, "ephemeral-storage": parse_quantity}
    for container in rendered.containers():
        resources = container["resources"]
        for name, parse in sizes.items():
            request, limit = resources["requests"][name], resources["limits"][name]
            assert parse(request) <= parse(limit), (container["name"], name)
    empty_dirs = sum(
        parse_quantity(v["emptyDir"]["sizeLimit"])
        for v in rendered.pod["volumes"]
        if "emptyDir" in v
    )
    limits = sum(
        parse_quantity(c["resources"]["limits"]["ephemeral-storage"])
        for c in rendered.pod["containers"]
    )
    assert empty_dirs < limits


QUANTITY = {"": 1, "m": 0.001, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}


def parse_quantity(text: str | int) -> float:
    """A Kubernetes quantity ("250m", "1", "64Mi") as a number."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|k|M|G|)", str(text))
    assert match, text
    return float(match.group(1)) * QUANTITY[match.group(2)]


def test_every_container_is_hardened(rendered: Rendered) -> None:
    """Non-root, read-only root file system, no privilege escalation, every capability
    dropped and none added, in every container."""
    pod = rendered.pod.get("securityContext", {})
    for container in rendered.containers():
        context = container["securityContext"]
        assert context.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, container["name"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context.get("privileged", False) is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert not context["capabilities"].get("add"), container["name"]
    assert pod.get("runAsUser", 0) != 0
    assert rendered.pod.get("automountServiceAccountToken") is False


def test_no_service_link_variables_reach_the_gateway(rendered: Rendered) -> None:
    """Service links are off, so Kubernetes injects no STATUSGATE_* variables of its own
    (STATUSGATE_PORT, ...) next to the ones the gateway reads."""
    assert rendered.pod["enableServiceLinks"] is False


def test_pod_user_is_the_image_user(rendered: Rendered) -> None:
    """The pod runs as the Dockerfile's numeric USER, so its volumes' fsGroup fits."""
    (user,) = re.findall(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.M)
    context = rendered.pod["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == user
    assert str(context["fsGroup"]) == user[1]


def test_writable_paths_are_volumes(rendered: Rendered) -> None:
    """With a read-only root, every writable mount is an emptyDir or a claimed volume, and
    /tmp is an emptyDir."""
    volumes = {v["name"]: v for v in rendered.pod["volumes"]}
    claims = {
        t["metadata"]["name"] for t in rendered.workload["spec"].get("volumeClaimTemplates", [])
    }
    for container in rendered.containers():
        for mount in container.get("volumeMounts", []):
            if mount.get("readOnly"):
                continue
            volume = volumes.get(mount["name"], {})
            assert (
                mount["name"] in claims or "emptyDir" in volume or "persistentVolumeClaim" in volume
            ), mount["name"]
        tmp = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp and "emptyDir" in volumes[tmp[0]["name"]], container["name"]


def test_image_is_pinned_to_the_package_version(rendered: Rendered) -> None:
    """Every container runs the one image, tagged with pyproject.toml's version, never latest."""
    kustomization = yaml.safe_load((KUBE / "base" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    expected = f"{image['newName']}:{package_version()}"
    assert {c["image"] for c in rendered.containers()} == {expected}
    assert not expected.endswith(":latest")


def test_metrics_are_scrapeable_on_the_admin_listener(rendered: Rendered) -> None:
    """The container names a port for the admin listener, where /metrics is served, and the
    Service exposes it."""
    config = rendered.mounted_config()
    admin = config["admin_listen"]["port"]
    assert port_number(rendered.gateway, "admin") == admin
    service = rendered.one("Service")
    assert "admin" in {p["name"] for p in service["spec"]["ports"]}
    # Both listeners take connections from outside the pod (kubelet probes, Prometheus).
    assert config["admin_listen"]["host"] in WILDCARD
    assert config["listen"]["host"] in WILDCARD


def test_service_monitor_scrapes_the_admin_port(monitored: Rendered) -> None:
    """The ServiceMonitor selects the Service, scrapes /metrics on its admin port and labels
    the targets job="statusgate", which the shipped alerts select."""
    monitor = monitored.one("ServiceMonitor")
    service = monitored.one("Service")
    assert labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "statusgate"} in endpoint[
        "relabelings"
    ]
    assert 'up{job="statusgate"}' in ALERTS.read_text()
    rule = monitored.one("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_network_policy_lets_agents_prometheus_and_dns_through(monitored: Rendered) -> None:
    """The NetworkPolicy selects the gateway pods, admits the agent and admin ports and
    lets the pods resolve names."""
    policy = monitored.one("NetworkPolicy")["spec"]
    labels = monitored.workload["spec"]["template"]["metadata"]["labels"]
    assert labels_match(policy["podSelector"]["matchLabels"], labels)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    ports = {port["port"] for rule in policy["ingress"] for port in rule["ports"]}
    assert ports == {"http", "admin"}
    dns = [port for rule in policy["egress"] for port in rule.get("ports", [])]
    assert {"port": 53, "protocol": "UDP"} in dns


CLUSTER_RANGES = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"}


def test_network_policy_sends_https_outside_the_cluster_only(monitored: Rendered) -> None:
    """The egress rule for providers (443) reaches any address except the private ranges
    a cluster's pods, Services and nodes live in and the cloud metadata range, for IPv4 and
    IPv6, and no egress rule reaches everywhere on every port."""
    egress = monitored.one("NetworkPolicy")["spec"]["egress"]
    (https,) = [rule for rule in egress if {"port": 443} in rule.get("ports", [])]
    blocks = {block["ipBlock"]["cidr"]: block["ipBlock"] for block in https["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    assert set(blocks["0.0.0.0/0"]["except"]) >= CLUSTER_RANGES
    assert {"fc00::/7", "fe80::/10"} <= set(blocks["::/0"]["except"])
    assert all(rule.get("to") and rule.get("ports") for rule in egress)


def test_ingress_terminates_tls_for_the_agent_routes_only(monitored: Rendered) -> None:
    """components/ingress: every host is covered by a TLS entry with a Secret, and every
    path goes to the Service's agent port (http), never the admin listener's."""
    spec = monitored.one("Ingress")["spec"]
    covered = {host for tls in spec["tls"] if tls.get("secretName") for host in tls["hosts"]}
    service = monitored.one("Service")
    agent_port = monitored.mounted_config()["listen"]["port"]
    paths = []
    for rule in spec["rules"]:
        assert rule["host"] in covered
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            (port,) = [p for p in service["spec"]["ports"] if p["name"] == backend["port"]["name"]]
            assert port_number(monitored.gateway, port["targetPort"]) == agent_port
            paths.append(path["path"])
    assert "/p/" in paths and "/mcp" in paths
    assert not [p for p in paths if p in {"/", "/admin", "/console", "/metrics"}]


def test_tls_component_makes_the_gateway_speak_tls_behind_the_ingress(
    renders: dict[Any, Rendered],
) -> None:
    """components/tls changes the gateway config only in listen.tls (the files of the Secret
    statusgate-listener-tls, mounted whole so a renewal lands in place, readable through
    the pod's fsGroup) and an https public_base_url; the probes speak HTTPS on the same
    ports and paths; the Ingress re-encrypts to the gateway (backend-protocol HTTPS)."""
    plain, tls = renders["redis", COMPONENTS], renders["redis", TLS]
    assert [o["kind"] for o in plain.objects] == [o["kind"] for o in tls.objects]
    base, changed = plain.mounted_config(), tls.mounted_config()
    listen = changed["listen"]
    config_dir = PurePosixPath(tls.config_path(tls.gateway)).parent
    files = {os.path.normpath(config_dir / listen["tls"][k]) for k in ("cert_file", "key_file")}
    assert listen.pop("tls") and listen == base["listen"]
    assert changed.pop("public_base_url").startswith("https://")
    base.pop("public_base_url")
    assert base == changed
    volumes = {v["name"]: v for v in tls.pod["volumes"]}
    (mount,) = [m for m in tls.gateway["volumeMounts"] if m["name"] == "listener-tls"]
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == LISTENER_TLS and "items" not in secret
    assert secret["defaultMode"] & 0o040 and tls.pod["securityContext"]["fsGroup"]
    assert "subPath" not in mount and mount["readOnly"] is True
    assert files == {f"{mount['mountPath']}/tls.crt", f"{mount['mountPath']}/tls.key"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = tls.gateway[probe]["httpGet"]
        assert get.pop("scheme") == "HTTPS" and get == plain.gateway[probe]["httpGet"]
    annotations = tls.one("Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    assert "scheme" not in plain.gateway["readinessProbe"]["httpGet"]


def test_demo_provider_is_a_loopback_sidecar_for_a_first_try(renders: dict[Any, Rendered]) -> None:
    """components/demo adds a sidecar serving the demo provider on the loopback address
    and port where the shipped policies point (as written, or as the demo's config
    ``upstreams`` redirects the pack's, which name their providers' real origins), keyed
    from the Secret."""
    plain, demo = renders["sqlite", ()], renders["sqlite", DEMO]
    assert [o["kind"] for o in plain.objects] == [o["kind"] for o in demo.objects]
    (sidecar,) = [c for c in demo.pod["containers"] if c is not demo.gateway]
    args = sidecar["args"]
    address = f"{args[args.index('--host') + 1]}:{args[args.index('--port') + 1]}"
    redirects = demo.mounted_config().get("upstreams", {})
    upstreams = set()
    for path in POLICIES.glob("*.yaml"):
        policy = yaml.safe_load(path.read_text())
        name = policy["provider"]
        upstream = redirects.get(name, redirects.get("*", policy["upstream"]))
        upstreams.add(upstream.replace("{provider}", name).removesuffix(f"/{name}"))
    assert upstreams == {f"http://{address}"}
    assert "ports" not in sidecar  # loopback only: nothing to expose
    ref = env_sources(sidecar)["DEMO_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == env_sources(demo.gateway)["DEMO_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert (
        demo.workload["spec"]["template"]["metadata"]["annotations"][
            "kubectl.kubernetes.io/default-container"
        ]
        == demo.gateway["name"]
    )


def aiohttp_shutdown_wait() -> float:
    """How long `statusgate serve` lets calls in flight finish at SIGTERM: aiohttp's
    runner default, which the gateway does not change."""
    for source in (ROOT / "gateway").rglob("*.py"):
        assert "shutdown_timeout" not in source.read_text(), f"{source} sets shutdown_timeout"
    default = inspect.signature(web.BaseRunner.__init__).parameters["shutdown_timeout"].default
    return float(default)


SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """A config duration ("30s", "500ms", "2m") in seconds (SPEC 2)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    assert match, text
    return float(match.group(1)) * SECONDS[match.group(2)]


@functools.cache
def default_max_hold() -> float:
    """polling.max_hold when a policy leaves it out, from `statusgate schema policy`."""
    schema = subprocess.run(
        [sys.executable, "-m", "gateway.run", "schema", "policy"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    polling = json.loads(schema.stdout)["$defs"]["Polling"]["properties"]
    return parse_duration(polling["max_hold"]["default"])  # written as in YAML: "1m"


def longest_hold(rendered: Rendered) -> float:
    """The largest polling.max_hold of the mounted policies (the CLI's schema gives the
    default), the longest a held call could last if shutdown did not answer it at once."""
    holds = [default_max_hold()]
    for path, text in rendered.mounted_files(rendered.gateway).items():
        if path.endswith((".yaml", ".yml")) and path != rendered.config_path(rendered.gateway):
            hold = (yaml.safe_load(text).get("polling") or {}).get("max_hold")
            holds += [] if hold is None else [parse_duration(hold)]
    return max(holds)


def test_grace_period_lets_held_calls_be_answered(rendered: Rendered) -> None:
    """terminationGracePeriodSeconds covers the preStop pause, the longest time a call can
    stay in flight after SIGTERM (a provider call is capped by upstream_timeout, a held call
    by the policies' max_hold, and aiohttp waits at most its shutdown timeout) and 10 s to
    close the audit file and the store."""
    grace = rendered.pod["terminationGracePeriodSeconds"]
    pause = rendered.gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    upstream = parse_duration(rendered.mounted_config()["limits"]["upstream_timeout"])
    in_flight = max(aiohttp_shutdown_wait(), upstream, longest_hold(rendered))
    assert grace >= pause + in_flight + 10


def test_sqlite_runs_one_replica_on_a_claimed_volume(renders: dict[Any, Rendered]) -> None:
    """SQLite: one replica of a StatefulSet (or a Recreate Deployment), its database on a
    PersistentVolumeClaim, and no HPA or PodDisruptionBudget."""
    sqlite = renders["sqlite", ()]
    workload = sqlite.workload
    assert workload["spec"]["replicas"] == 1
    if workload["kind"] == "Deployment":
        assert workload["spec"]["strategy"]["type"] == "Recreate"
    else:
        assert workload["spec"]["podManagementPolicy"] == "OrderedReady"
    url = env_sources(sqlite.gateway)["STATUSGATE_STORE_URL"]["value"]
    assert url.startswith("sqlite:////")
    database = PurePosixPath(url.removeprefix("sqlite:///"))
    assert mount_of(sqlite, database) in claimed_mounts(sqlite)
    assert not sqlite.of_kind("HorizontalPodAutoscaler")
    assert not sqlite.of_kind("PodDisruptionBudget")


def mount_of(rendered: Rendered, path: PurePosixPath) -> str:
    """The volume name whose mount holds ``path`` in the main container."""
    mounts = [
        m
        for m in rendered.gateway["volumeMounts"]
        if path.is_relative_to(PurePosixPath(m["mountPath"]))
    ]
    assert mounts, path
    deepest = max(mounts, key=lambda m: len(m["mountPath"]))
    return str(deepest["name"])


def claimed_mounts(rendered: Rendered) -> set[str]:
    """Volumes backed by a PersistentVolumeClaim (one per pod, or a named claim)."""
    templates = {
        t["metadata"]["name"] for t in rendered.workload["spec"].get("volumeClaimTemplates", [])
    }
    named = {v["name"] for v in rendered.pod["volumes"] if "persistentVolumeClaim" in v}
    return templates | named


def test_replicated_overlays_scale_and_survive_drains(replicated: Rendered) -> None:
    """Redis and PostgreSQL: two replicas at least, a PodDisruptionBudget over the pods that
    still lets a drain proceed, and an autoscaling/v2 HPA on the workload from two up."""
    workload = replicated.workload
    replicas = workload["spec"]["replicas"]
    assert replicas >= 2
    labels = workload["spec"]["template"]["metadata"]["labels"]
    budget = replicated.one("PodDisruptionBudget")["spec"]
    assert labels_match(budget["selector"]["matchLabels"], labels)
    if "maxUnavailable" in budget:
        assert 1 <= budget["maxUnavailable"] < replicas
    else:
        assert 1 <= budget["minAvailable"] < replicas
    hpa = replicated.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (workload["kind"], workload["metadata"]["name"])
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_replicated_overlays_spread_across_nodes(replicated: Rendered) -> None:
    """Replicas are spread across nodes: a hard topology spread on kubernetes.io/hostname
    over the gateway's own pods."""
    labels = replicated.workload["spec"]["template"]["metadata"]["labels"]
    spreads = replicated.pod["topologySpreadConstraints"]
    (by_node,) = [s for s in spreads if s["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node["whenUnsatisfiable"] == "DoNotSchedule" and by_node["maxSkew"] == 1
    assert labels_match(by_node["labelSelector"]["matchLabels"], labels)


def test_postgres_migrates_before_the_new_version_serves(renders: dict[Any, Rendered]) -> None:
    """PostgreSQL: an init container runs `statusgate migrate` with the gateway's image on
    a config of its own naming the same store, so no pod serves before the layout is
    upgraded; pods start one at a time."""
    postgres = renders["postgres", ()]
    (migrate,) = postgres.pod["initContainers"]
    assert " ".join(["statusgate", *migrate["args"]]) == MIGRATE and "command" not in migrate
    assert migrate["image"] == postgres.gateway["image"]
    assert postgres.mounted_config(migrate)["store"] == postgres.mounted_config()["store"]
    assert postgres.workload["spec"]["podManagementPolicy"] == "OrderedReady"
    for other in ("sqlite", "redis"):
        assert not renders[other, ()].pod.get("initContainers")


def test_migrate_gets_only_the_store_url(renders: dict[Any, Rendered]) -> None:
    """The init container's environment is the store URL alone, from the Secret key of the
    role that owns the schema (migrate-url), while the gateway serves with another key's
    (url); it mounts its one-key config and nothing else from a ConfigMap or a Secret."""
    for components in ((), COMPONENTS, DEMO):
        postgres = renders["postgres", components]
        (migrate,) = postgres.pod["initContainers"]
        assert env_sources(migrate) == {
            "STATUSGATE_STORE_URL": {
                "name": "STATUSGATE_STORE_URL",
                "valueFrom": {"secretKeyRef": {"name": "statusgate-store", "key": "migrate-url"}},
            }
        }
        serve = env_sources(postgres.gateway)["STATUSGATE_STORE_URL"]["valueFrom"]
        assert serve["secretKeyRef"] == {"name": "statusgate-store", "key": "url"}
        assert list(postgres.mounted_files(migrate)) == [postgres.config_path(migrate)]
        assert postgres.mounted_config(migrate) == {"store": "${STATUSGATE_STORE_URL}"}
        volumes = {v["name"]: v for v in postgres.pod["volumes"]}
        for mount in migrate["volumeMounts"]:
            assert "secret" not in volumes[mount["name"]], mount["name"]


def test_migrate_command_exists_in_the_gateway() -> None:
    """The CLI the init container calls knows `migrate --config` (SPEC 18)."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.run", "migrate", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    if done.returncode != 0 and "invalid choice: 'migrate'" in done.stderr:
        pytest.skip("this gateway has no `statusgate migrate` yet (SPEC 18, the PostgreSQL store)")
    assert done.returncode == 0 and "--config" in done.stdout


def test_audit_log_is_on_each_replicas_own_volume(rendered: Rendered) -> None:
    """The audit chain is written on a claimed volume of the pod's own (a StatefulSet's
    volumeClaimTemplates), in a file named after the pod: replicas never share a chain."""
    audit = rendered.mounted_config()["audit"]
    path = audit["path"]
    assert "${POD_NAME}" in path and PurePosixPath(path).is_absolute()
    assert env_sources(rendered.gateway)["POD_NAME"]["valueFrom"]["fieldRef"] == {
        "fieldPath": "metadata.name"
    }
    volume = mount_of(rendered, PurePosixPath(path))
    assert rendered.workload["kind"] == "StatefulSet"
    templates = {t["metadata"]["name"] for t in rendered.workload["spec"]["volumeClaimTemplates"]}
    assert volume in templates
    assert audit["hmac_key_env"]


def lay_out(rendered: Rendered, container: dict[str, Any], root: Path) -> Path:
    """The container's ConfigMap files under ``root`` at their mount paths (an empty
    ConfigMap is an empty folder); the config path."""
    volumes = {volume["name"]: volume for volume in rendered.pod["volumes"]}
    for mount in container.get("volumeMounts", []):
        if "configMap" in volumes.get(mount["name"], {}):
            (root / mount["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path, text in rendered.mounted_files(container).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for mount in container.get("volumeMounts", []):  # components/tls: a certificate of a test CA
        secret = volumes.get(mount["name"], {}).get("secret", {})
        if secret.get("secretName") == LISTENER_TLS:
            from certs import TestCA

            folder = root / mount["mountPath"].lstrip("/")
            issued = TestCA(root / "test-ca").issue("listener")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "tls.crt").write_bytes(issued.cert.read_bytes())
            (folder / "tls.key").write_bytes(issued.key.read_bytes())
    return root / rendered.config_path(container).lstrip("/")


def placeholder_env(rendered: Rendered, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment with a placeholder for every Secret it references."""
    env = {}
    for name, source in env_sources(container).items():
        if "value" in source:
            env[name] = source["value"]
            continue
        ref = source["valueFrom"]
        if "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "metadata.name", name
            env[name] = f"{rendered.workload['metadata']['name']}-0"
            continue
        key = (ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        if key in {("statusgate-store", "url"), ("statusgate-store", "migrate-url")}:
            real = (
                os.environ.get("STATUSGATE_TEST_POSTGRES")
                if rendered.overlay == "postgres"
                else None
            )
            env[name] = real or PLACEHOLDER_STORES[rendered.overlay]
            continue
        assert key in PLACEHOLDER_SECRETS, f"no placeholder for Secret {key}: add one here"
        env[name] = PLACEHOLDER_SECRETS[key]
    return env


def test_each_container_loads_its_mounted_configuration(rendered: Rendered, tmp_path: Path) -> None:
    """The command each container runs loads what it mounts, laid out at the mount paths,
    with placeholder secrets in its environment: the gateway's config and policies pass
    `statusgate check` (no policy without the demo, every shipped one with it), and the
    init container's `statusgate migrate` loads its config and gets as far as the database.
    A command that connects to PostgreSQL cannot reach the placeholder database: then its
    one complaint must be the store's (with STATUSGATE_TEST_POSTGRES set, the gateway's
    check uses that real database; the real migration is the next test's)."""
    for container in config_loaders(rendered):
        config = lay_out(rendered, container, tmp_path / container["name"])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            **placeholder_env(rendered, container),
        }
        migrating = container["args"][0] == "migrate"
        if migrating:
            env["STATUSGATE_STORE_URL"] = PLACEHOLDER_STORES["postgres"]
        command = "migrate" if migrating else "check"
        done = subprocess.run(
            [sys.executable, "-m", "gateway.run", command, "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        for secret in PLACEHOLDER_SECRETS.values():
            assert secret not in done.stdout + done.stderr
        unreachable = env["STATUSGATE_STORE_URL"] == PLACEHOLDER_STORES.get("postgres")
        if unreachable and done.returncode == 1:
            (line,) = done.stderr.strip().splitlines()
            store = "statusgate migrate: postgresql: " if migrating else f"{config}: store: "
            assert line.startswith(store), line
            continue
        assert done.returncode == 0, f"{container['name']}: {done.stderr}"
        assert f": ok: {len(rendered.mounted_policies())} policies" in done.stdout


def test_init_container_migrates_a_real_database_twice(
    renders: dict[Any, Rendered],
    tmp_path: Path,
    postgres_base_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The init container's command, on its mounted config and environment, creates the
    layout of an empty PostgreSQL and finds it up to date the next time (every pod start
    runs it); then the gateway's own config passes `statusgate check` on that database.
    The database is a schema of this run's (the shared server's own is never touched)."""
    schema = f"sgtest_k8s_{uuid.uuid4().hex[:12]}"
    joiner = "&" if "?" in postgres_base_url else "?"
    url = f"{postgres_base_url}{joiner}schema={schema}"
    monkeypatch.setenv("STATUSGATE_TEST_POSTGRES", url)  # what placeholder_env hands the pod
    try:
        _migrate_twice_then_check(renders, tmp_path, url)
    finally:
        drop_schema(postgres_base_url.split("?", 1)[0], schema)


def _migrate_twice_then_check(renders: dict[Any, Rendered], tmp_path: Path, url: str) -> None:
    postgres = renders["postgres", ()]
    (migrate,) = postgres.pod["initContainers"]
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
    runs = []
    for container, command in (
        (migrate, "migrate"),
        (migrate, "migrate"),
        (postgres.gateway, "check"),
    ):
        config = lay_out(postgres, container, tmp_path / container["name"])
        env = base | placeholder_env(postgres, container)
        assert env["STATUSGATE_STORE_URL"] == url
        runs.append(
            subprocess.run(
                [sys.executable, "-m", "gateway.run", command, "--config", str(config)],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
        )
        assert runs[-1].returncode == 0, runs[-1].stderr
    assert "up to date" in runs[1].stdout and ": ok: " in runs[2].stdout


async def test_sigterm_answers_held_calls_within_the_grace_period(
    renders: dict[Any, Rendered], upstream: tuple[Any, str], tmp_path: Path
) -> None:
    """`statusgate serve` on the SQLite demo's mounted config (ports, paths and the demo
    upstream moved onto this machine) answers a held call at SIGTERM, exits 0 well within
    terminationGracePeriodSeconds, and leaves an audit chain that `audit verify` accepts."""
    sqlite = renders["sqlite", DEMO]
    config_path = lay_out(sqlite, sqlite.gateway, tmp_path / "root")
    config = yaml.safe_load(config_path.read_text())
    port = free_port()
    config["listen"] = {"host": "127.0.0.1", "port": port}
    config["admin_listen"] = {"host": "127.0.0.1", "port": free_port()}
    config["store"] = f"sqlite:///{tmp_path / 'statusgate.db'}"
    config["audit"]["path"] = str(tmp_path / "audit-${POD_NAME}.jsonl")
    config["upstreams"] = {}  # demo-jobs goes to this test's provider, as its policy says
    config_path.write_text(yaml.safe_dump(config))
    policy = config_path.parent / config["policies_dir"] / "demo-jobs.yaml"
    data = yaml.safe_load(policy.read_text())
    policy.write_text(yaml.safe_dump({**data, "upstream": upstream[1]}))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        **placeholder_env(sqlite, sqlite.gateway),
        "STATUSGATE_AGENT_TOKEN_SHA256": sha(AGENT_TOKEN),
        "DEMO_API_KEY": PROVIDER_KEY,
    }
    env.pop("STATUSGATE_STORE_URL")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.run", "serve", "--config", str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await asyncio.to_thread(wait_until_up, port, process)
        base = f"http://127.0.0.1:{port}/p/demo-jobs/v1/jobs"
        auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        async with aiohttp.ClientSession() as http:
            body = {"demo_submit": {"poll_after_seconds": 0}, "demo_script": [{"state": "running"}]}
            async with http.post(base, json=body, headers={**auth, "Idempotency-Key": "k8s"}) as r:
                assert r.status == 202, await r.text()
                job = (await r.json())["id"]

            async def held() -> tuple[int, str, float]:
                headers = {**auth, "Prefer": "wait=60"}
                async with http.get(f"{base}/{job}", headers=headers) as r:
                    await r.read()
                    state = r.headers.get("Statusgate-Provider-State", "")
                    return r.status, state, time.monotonic()

            call = asyncio.create_task(held())
            await asyncio.sleep(2)  # held: the job stays running, the wait is 60 s
            assert not call.done()
            stopped = time.monotonic()
            process.send_signal(signal.SIGTERM)
            status, state, answered = await asyncio.wait_for(call, 10)
        assert (status, state) == (200, "running")
        assert answered - stopped < 5
        grace = sqlite.pod["terminationGracePeriodSeconds"]
        pause = sqlite.gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
        code = await asyncio.to_thread(process.wait, grace - pause)
        assert code == 0 and time.monotonic() - stopped < grace - pause
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate(timeout=10)
    assert b"Traceback" not in stderr
    audit = tmp_path / f"audit-{env['POD_NAME']}.jsonl"
    verify = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.run",
            "audit",
            "verify",
            str(audit),
            "--key-env",
            "STATUSGATE_AUDIT_KEY",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0 and "chain intact" in verify.stdout, verify.stdout
