"""Write Prometheus alerting rules for a drill plan's `alerts:` section.

Each rule gets `labels.severity`, `labels.owner` and `annotations.action` (and `runbook_url`
when given). A rule without an owner or an action is refused: a threshold nobody acts on is
analysis, not alerting. Check the output with `promtool check rules FILE`.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="plan file (YAML) with an alerts: section")
    parser.add_argument(
        "--engine", help="engine whose metric names to use (default: the plan's target.engine)"
    )
    parser.add_argument("--group", help="rule group name (default: vramlab-<plan name>)")
    parser.add_argument("-o", "--output", help="write here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from vramlab.alerts.rules import build_rule_groups, to_yaml
    from vramlab.cli.outputs import check_writable
    from vramlab.drill.plan import load_plan
    from vramlab.errors import ConfigError
    from vramlab.planfile import read_yaml

    if args.output:
        check_writable(args.output, "rules file")
    data = read_yaml(args.plan, "plan").data
    if isinstance(data, dict) and not data.get("alerts"):
        kind = data.get("kind")
        raise ConfigError(
            f"{args.plan}: the plan has no alerts: section, so there is nothing to write"
            + (" (an experiment plan has none: " if kind == "experiment" else " (")
            + "alerts: belong to drill plans; examples/oom-drill.yaml has some)"
        )
    plan = load_plan(args.plan)
    engine = args.engine or plan.target.engine
    if engine == "sim":
        engine = plan.target.sim.engine if plan.target.sim else "vllm"
    doc = build_rule_groups(plan.alerts, engine, args.group or f"vramlab-{plan.name}")
    text = to_yaml(doc)
    for line in plan.old_name_notes():
        print(f"vramlab alerts: note: {line}", file=sys.stderr)
    if args.output:
        from vramlab.cli.outputs import write_output

        write_output(args.output, text, "rules file")
    else:
        sys.stdout.write(text)
    return 0
