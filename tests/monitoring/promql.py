"""What the shipped rules and dashboards query: their PromQL expressions and the metric names in them.

A small reader of PromQL, enough for names: strings, label matchers, ranges and the label lists of
``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` are removed, then every
identifier that is not a function call, a keyword or a number is a metric (or a recorded series).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "collections/ansible_collections/calque/gpu/roles/monitoring/files"
RULES = FILES / "prometheus/calque-rules.yml"
DASHBOARDS = sorted((FILES / "grafana").glob("*.json"))

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,")


def names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (``calque:...`` recorded series included)."""
    text = _MATCHERS.sub(" ", _STRING.sub('""', expr))
    text = _LABEL_LIST.sub(" ", _RANGE.sub(" ", text))
    found: set[str] = set()
    for m in _IDENT.finditer(text):
        word, rest = m.group(), text[m.end() :].lstrip()
        before = text[m.start() - 1 : m.start()]
        if word in KEYWORDS or rest.startswith("(") or word.lower() in ("inf", "nan"):
            continue
        if before == "$" or before.isdigit() or before == ".":  # a variable, 1e3, 5m
            continue
        found.add(word)
    return found


def rule_groups() -> list[dict[str, object]]:
    groups: list[dict[str, object]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def rules() -> Iterator[dict[str, str]]:
    for group in rule_groups():
        yield from group["rules"]  # type: ignore[misc]


def dashboard_queries(path: Path) -> Iterator[str]:
    """Every panel target's expression and every query variable's metric (``label_values(M, L)``)."""
    doc = json.loads(path.read_text())
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.match(var["query"]["query"])
            assert m, f"{path.name}: variable {var['name']}: only label_values(METRIC, LABEL) is read"
            yield m.group(1)


def all_queries() -> Iterator[tuple[str, str]]:
    """(where, expression) of every rule and dashboard query."""
    for rule in rules():
        yield f"rule {rule.get('record') or rule.get('alert')}", rule["expr"]
    for path in DASHBOARDS:
        for expr in dashboard_queries(path):
            yield f"dashboard {path.name}", expr
