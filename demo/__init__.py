"""`pd-gateway demo`: a simulated deployment and the gateway in front of it, from one router.yaml.

`plan` derives the simulators a configuration needs, `ports` moves the configuration to
where they really listen, `run` starts and stops everything, `instructions` prints what to
try, `cli` registers the command. Like `sim/` and `bench/`, this package is test equipment
beside the gateway: the gateway never imports it (router/commands.py loads the command).
"""

from demo.plan import DemoError
from demo.run import run_demo

__all__ = ["DemoError", "run_demo"]
