"""_broken_adapter.py: a pytest plugin that breaks the IPVS adapter in the middle of a check, on purpose.

    PYTEST_ADDOPTS="-p suites.lab._broken_adapter" l4lab conform --dut ipvs -k ...

`IpvsDut.remove_real` asks the VM's real ipvsadm to delete a real that is in no service, so ipvsadm
exits non-zero in the middle of the check: the adapter raises, as it would for any command of
ours that fails. The verdict must be an error, never a finding about IPVS (suites/lab/test_conform.py).
"""

from __future__ import annotations

import pytest

NO_SUCH_REAL = "192.0.2.254"  # the client's prefix: never a real of any topology


def pytest_configure(config: pytest.Config) -> None:
    from lab.dut.ipvs import IpvsDut

    def remove_real(self: IpvsDut, real: str) -> None:
        del real
        self.vm.ipvsadm("-d", "-t", f"{self.vips()[0]}:80", "-r", f"{NO_SUCH_REAL}:80")

    IpvsDut.remove_real = remove_real  # type: ignore[method-assign]
