"""contract/envvars.py: env values expand $NAME and ${NAME}, $$ is one $, any other $ is refused."""

from __future__ import annotations

import pytest

from remote_payload.contract import envvars


@pytest.mark.parametrize("value", ["/opt/v/bin:$PATH", "${HOME}/x", "a$$b", "plain", "$A_1${B}"])
def test_the_three_forms_are_accepted(value: str) -> None:
    assert envvars.problem(value) is None


@pytest.mark.parametrize("value", ["$(pwd)", "x${A:-1}", "cost $5", "trailing $", "${not closed"])
def test_any_other_dollar_is_refused_with_the_rule(value: str) -> None:
    message = envvars.problem(value)
    assert message is not None and "write $$ for a literal $" in message


def test_values_expand_in_order_against_the_environment() -> None:
    env = envvars.expand_all({"A": "1", "PATH": "/v:$PATH", "B": "${A}x$$$NOPE"}, {"PATH": "/usr/bin"})
    assert env == {"PATH": "/v:/usr/bin", "A": "1", "B": "1x$"}
