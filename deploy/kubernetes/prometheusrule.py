"""Writes components/servicemonitor/prometheusrule.yaml from deploy/prometheus/alerts.yaml.

The alert rules have one source, deploy/prometheus/alerts.yaml (checked and unit-tested by
promtool); the Prometheus Operator wants them wrapped in a PrometheusRule. Run it after
changing the rules (`make kubernetes-rules`); tests/test_kubernetes.py fails while the
PrometheusRule and alerts.yaml differ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parent / "prometheus" / "alerts.yaml"
TARGET = HERE / "components" / "servicemonitor" / "prometheusrule.yaml"
HEADER = (
    "# Generated from deploy/prometheus/alerts.yaml by deploy/kubernetes/prometheusrule.py\n"
    "# (make kubernetes-rules): edit alerts.yaml, never this file.\n"
)


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL expressions), as alerts.yaml writes them."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def prometheus_rule(alerts: Path = ALERTS) -> dict[str, Any]:
    """The PrometheusRule object that carries every group of ``alerts`` unchanged."""
    groups = yaml.safe_load(alerts.read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "statusgate",
            "labels": {
                "app.kubernetes.io/name": "statusgate",
                "app.kubernetes.io/part-of": "statusgate",
            },
        },
        "spec": {"groups": groups},
    }


def render(alerts: Path = ALERTS) -> str:
    body = yaml.dump(prometheus_rule(alerts), Dumper=_Dumper, sort_keys=False, width=96, indent=2)
    return HEADER + body


def main() -> int:
    TARGET.write_text(render())
    print(f"{TARGET.relative_to(HERE.parent.parent)}: written from {ALERTS.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
