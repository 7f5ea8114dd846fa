"""`pd-gateway demo`: a simulated deployment and the gateway in front of it, from one router.yaml.

`plan` derives the simulators a configuration needs, `ports` moves the configuration to
where they really listen, `run` starts and stops everything, `usage` prints what to try.
`sim/` is test equipment: it is imported only inside `run_demo`, never by the gateway.
"""

from router.demo.plan import DemoError
from router.demo.run import run_demo

__all__ = ["DemoError", "run_demo"]
