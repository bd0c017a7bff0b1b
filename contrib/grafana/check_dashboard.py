"""Checks a Grafana dashboard against Grafana's own dashboard model, as Grafana's Foundation
SDK (grafana-foundation-sdk, generated from Grafana's schemas) reads and writes it.

    python3 contrib/grafana/check_dashboard.py contrib/grafana/tower-redis-lock.json

The dashboard is read into the model and written back: a key the model does not know (a
misspelling, a field of another Grafana) would be dropped, and a value it reads otherwise
would change, so both fail. Then what an import needs and the model does not enforce: a
Prometheus data-source variable every query uses, the job and instance filters, panel ids
unique, panels on Grafana's 24-column grid without overlapping, and a query in every panel.
Exits 1 with each problem on its own line.
"""

import json
import sys

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def lost_in_round_trip(written, read_back, path=""):
    """Every key of `written` that the model dropped or read as another value."""
    if isinstance(written, dict):
        if not isinstance(read_back, dict):
            return [f"{path}: read as {type(read_back).__name__}"]
        problems = []
        for key, value in written.items():
            if key not in read_back:
                problems.append(f"{path}/{key}: unknown to Grafana's dashboard model")
            else:
                problems += lost_in_round_trip(value, read_back[key], f"{path}/{key}")
        return problems
    if isinstance(written, list):
        if not isinstance(read_back, list) or len(written) != len(read_back):
            return [f"{path}: list read back otherwise"]
        problems = []
        for index, (item, back) in enumerate(zip(written, read_back)):
            problems += lost_in_round_trip(item, back, f"{path}[{index}]")
        return problems
    if written != read_back:
        return [f"{path}: {written!r} read back as {read_back!r}"]
    return []


def layout_problems(dashboard):
    problems = []
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    source = variables.get("datasource")
    if not source or source.get("type") != "datasource" or source.get("query") != "prometheus":
        problems.append("no Prometheus data-source variable named datasource")
    for name in ("job", "instance"):
        if name not in variables:
            problems.append(f"no {name} filter variable")
    ids, cells = set(), {}
    for panel in dashboard.get("panels", []):
        title = panel.get("title")
        if panel.get("id") in ids:
            problems.append(f"{title}: id {panel.get('id')} twice")
        ids.add(panel.get("id"))
        grid = panel.get("gridPos", {})
        x, y, w, h = (grid.get(k) for k in ("x", "y", "w", "h"))
        if not all(isinstance(v, int) and v >= 0 for v in (x, y, w, h)) or w < 1 or x + w > 24:
            problems.append(f"{title}: gridPos {grid} is not on the 24-column grid")
            continue
        for column in range(x, x + w):
            for line in range(y, y + h):
                if (column, line) in cells:
                    problems.append(f"{title}: overlaps {cells[(column, line)]}")
                    break
                cells[(column, line)] = title
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets", [])
        if not targets:
            problems.append(f"{title}: no query")
        if panel.get("datasource") != DATASOURCE:
            problems.append(f"{title}: its data source is not the datasource variable")
        for target in targets:
            if target.get("datasource") != DATASOURCE or not target.get("expr"):
                problems.append(f"{title}: query {target.get('refId')} has no expr or source")
    return problems


def main(path):
    with open(path, encoding="utf-8") as file:
        written = json.load(file)
    register_default_plugins()
    read_back = json.loads(json.dumps(Dashboard.from_json(written), cls=JSONEncoder))
    problems = lost_in_round_trip(written, read_back) + layout_problems(written)
    for problem in problems:
        print(f"{path}: {problem}", file=sys.stderr)
    if problems:
        return 1
    panels = [p for p in written["panels"] if p.get("type") != "row"]
    print(f"{path}: Grafana's dashboard model reads and writes it unchanged; {len(panels)} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
