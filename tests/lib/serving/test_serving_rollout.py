"""Canary rollouts without a cluster: bad arguments are refused before anything starts, and
the automatic rollback's judgement."""

from __future__ import annotations

import pytest
import serving_models

from michelangelo.lib import serving
from michelangelo.lib.model_registry import ModelRegistry
from michelangelo.lib.serving._rollout import percentile


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = ModelRegistry(str(tmp_path_factory.mktemp("rollout") / "registry"))
    serving_models.register_row_linear(reg, seed=0)
    serving_models.register_row_linear(reg, seed=1)
    return reg


@pytest.mark.parametrize("kwargs, fragment", [
    ({"canary": 1.5}, "canary=1.5 must be a share strictly between 0 and 1"),
    ({"canary": 0}, "canary=0 must be a share strictly between 0 and 1"),
    ({"canary": 1.0}, "use promote(name)"),
    ({"canary": float("nan")}, "canary=nan must be"),
    ({"canary": True}, "canary=True must be"),
    ({"canary": 0.2, "traffic": {1: 0.8, 2: 0.2}}, "canary= or traffic=, not both"),
    ({"traffic": {1: 0.8, 2: 0.3}}, "the weights sum to 1.1, not 1"),
    ({"traffic": {1: 0.5, 3: 0.5}}, "gives no weight to the revision being deployed (2)"),
    ({"traffic": {1: 1.0, 2: 0.0}}, "revision 2's weight must be strictly between 0 and 1"),
    ({"traffic": {1: 1.2, 2: -0.2}}, "the weight of revision 1 is 1.2"),
    ({"traffic": {2: 1.0}}, "must map two revision numbers"),
    ({"traffic": {"1": 0.8, 2: 0.2}}, "must map two revision numbers"),
    ({"auto_rollback": serving.AutoRollback(max_error_rate=0.1)}, "pass canary= (or traffic=)"),
    ({"canary": 0.2, "auto_rollback": 0.1}, "auto_rollback=0.1 must be an AutoRollback"),
])
def test_bad_rollout_arguments_are_refused_before_any_cluster(registry, monkeypatch, kwargs,
                                                               fragment):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError) as caught:
        serving.deploy("serving/rows:2", name="rows", registry=registry, **kwargs)
    assert fragment in str(caught.value)
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize("kwargs, fragment", [
    ({}, "needs max_error_rate=, max_p99_latency_s= or both"),
    ({"max_error_rate": 1.0}, "max_error_rate=1.0 must be a share in [0, 1)"),
    ({"max_p99_latency_s": 0}, "max_p99_latency_s=0 must be a number of seconds > 0"),
    ({"max_error_rate": 0.1, "window": 0}, "window=0 must be an integer >= 1"),
])
def test_auto_rollback_policy_is_checked(kwargs, fragment):
    with pytest.raises(ValueError) as caught:
        serving.AutoRollback(**kwargs)
    assert fragment in str(caught.value)


def test_auto_rollback_judges_the_last_window_of_requests():
    policy = serving.AutoRollback(max_error_rate=0.2, max_p99_latency_s=0.5, window=10)
    healthy = [(False, 0.01)] * 10
    assert policy.verdict(healthy[:9] + [(True, 0.01)] * 0) is None  # not a full window yet
    assert policy.verdict(healthy) is None
    # Two failures in ten is the limit, three is over it; older outcomes no longer count.
    assert policy.verdict([(True, 0.01)] * 5 + healthy[:8] + [(True, 0.01)] * 2) is None
    reason = policy.verdict(healthy[:7] + [(True, 0.01)] * 3)
    assert reason == ("error rate 30% over the canary's last 10 requests is above "
                      "max_error_rate=0.2")
    slow = policy.verdict(healthy[:9] + [(False, 2.0)])
    assert slow == ("p99 latency 2000 ms over the canary's last 10 requests is above "
                    "max_p99_latency_s=0.5")
    assert percentile([0.1 * i for i in range(1, 101)], 99) == pytest.approx(9.9)
    assert percentile([3.0], 99) == 3.0


def test_cli_canary_refuses_a_bad_share_in_one_line(registry, monkeypatch):
    from click.testing import CliRunner

    from michelangelo.cli._main import cli

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = CliRunner().invoke(cli, ["deployments", "canary", "rows", "serving/rows:2",
                                      "--share", "1.5", "--registry", str(registry.url)])
    assert result.exit_code == 1
    assert "canary=1.5 must be a share strictly between 0 and 1" in result.output
    result = CliRunner().invoke(cli, ["deployments", "canary", "rows", "serving/rows:2",
                                      "--max-error-rate", "2", "--registry", str(registry.url)])
    assert result.exit_code == 1 and "max_error_rate=2.0 must be a share" in result.output
