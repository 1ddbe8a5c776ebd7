"""Ray's node agent for raylight's embedded cluster: Ray's own agent, without its modules.

Run by the raylet as ``python -u _embedded_agent.py <ray>/dashboard/agent.py <args>``
(``runtime._lean_head`` puts this file in front of the agent's script). It runs that
script as Ray would, except that the agent loads none of its dashboard modules: Ray's
agent imports every module under ``ray.dashboard.modules`` to find them (about a second
on a 2-core machine, on the path of every embedded start, since the raylet registers its
node only once the agent has started), and what they serve (the dashboard, the Jobs API,
the state API's logs, health checks over HTTP, metrics) the embedded cluster does not
have. The agent process itself, its ports and its watch on the raylet stay Ray's.

This file is a script: it must not import raylight (which would import torch) and is not
imported by it.
"""

import os
import runpy
import sys

import ray.dashboard.utils as dashboard_utils


def no_modules(module_type: type) -> list[type]:
    return []


def main() -> None:
    agent = sys.argv[1]
    dashboard_utils.get_all_modules = no_modules
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(agent)  # as if Ray had run the agent's script itself
    runpy.run_path(agent, run_name="__main__")


if __name__ == "__main__":
    main()
