"""The test harness the suites share, as a library: labs and balancers as handles, names, polling, CPU pins.

The pytest side (options, hooks, fixtures) is `lab.pytest_plugin`; this package holds what those
fixtures hand to tests and what tests import, so that no test module imports a conftest.
"""

from lab.cpu import pinned_cpu
from lab.harness.labs import REPO, Lab, LabBalancer, NetnsLab, TargetLab
from lab.harness.names import unique_name
from lab.poll import PollTimeoutError, poll

__all__ = ["REPO", "Lab", "LabBalancer", "NetnsLab", "PollTimeoutError", "TargetLab", "pinned_cpu", "poll",
           "unique_name"]
