"""Policy resolution: precedence, sources, and the exact wording of configuration errors."""

from __future__ import annotations

import pytest

from sharedfs import ConfigError
from sharedfs.model.policy import Layer, explicit_layer, resolve


def test_defaults_have_the_source_default() -> None:
    policy = resolve([])
    assert (policy.lock, policy.cache, policy.wait_timeout, policy.max_workers) == ("auto", "auto", 300.0, "auto")
    assert policy.source("lock") == "default"
    assert policy.node_id and policy.source("node_id") == "default (host name)"


def test_layers_apply_by_priority_and_remember_their_origin() -> None:
    file = Layer("file", 100, {"lock": "soft", "wait_timeout": 5}, {"lock": "f.toml: lock", "wait_timeout": "f.toml: wait_timeout"})
    env = Layer("environment", 200, {"lock": "posix"}, {"lock": "SHAREDFS_LOCK"})
    policy = resolve([env, file, explicit_layer({"cache": "node-local"})])
    assert policy.lock == "posix" and policy.source("lock") == "SHAREDFS_LOCK"
    assert policy.wait_timeout == 5.0 and policy.source("wait_timeout") == "f.toml: wait_timeout"
    assert policy.cache == "node-local" and policy.source("cache") == "argument cache"


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [
        ("lock", "flok", "SHAREDFS_LOCK='flok' is not valid: expected one of auto, flock, posix, soft, lease"),
        ("cache", "local", "SHAREDFS_CACHE='local' is not valid: expected one of auto, shared, node-local"),
        ("wait_timeout", "-3", "SHAREDFS_WAIT_TIMEOUT='-3' is not valid: expected a positive number of seconds"),
        ("wait_timeout", "nan", "SHAREDFS_WAIT_TIMEOUT='nan' is not valid"),
        ("max_workers", "0", "SHAREDFS_MAX_WORKERS='0' is not valid: expected auto, off or a whole number from 1 to 4096"),
        ("max_workers", "5000", "SHAREDFS_MAX_WORKERS='5000' is not valid: expected auto, off or a whole number from 1"),
        ("max_workers", "9" * 5000, "SHAREDFS_MAX_WORKERS='99999"),
        ("wait_timeout", "2592001", ("SHAREDFS_WAIT_TIMEOUT='2592001' is not valid: expected a positive number of "
                                     "seconds, at most 2592000 (30 days)")),
        ("wait_timeout", "inf", "SHAREDFS_WAIT_TIMEOUT='inf' is not valid"),
        ("lease_seconds", "1e300", ("SHAREDFS_LEASE_SECONDS='1e300' is not valid: expected a number of seconds "
                                    "from 1 to 86400 (one day)")),
        ("lease_seconds", "0.5", "SHAREDFS_LEASE_SECONDS='0.5' is not valid"),
        ("node_id", "n" * 300, "SHAREDFS_NODE_ID='nnnn"),
        ("node_id", "n" * 65, "SHAREDFS_NODE_ID='nnnn"),
        ("node_id", "..", "SHAREDFS_NODE_ID='..' is not valid: expected a name of 1 to 64 characters from A-Z a-z"),
        ("node_id", "gpu[01]", "SHAREDFS_NODE_ID='gpu[01]' is not valid"),
        ("cache_root", "relative/dir", "SHAREDFS_CACHE_ROOT='relative/dir' is not valid: expected an absolute"),
        ("node_id", "a b", "SHAREDFS_NODE_ID='a b' is not valid"),
        ("strict", "maybe", "SHAREDFS_STRICT='maybe' is not valid"),
    ],
)
def test_bad_values_name_the_variable_the_value_and_what_is_allowed(key: str, raw: str, message: str) -> None:
    from sharedfs.model.settings import BY_NAME

    layer = Layer("environment", 200, {key: raw}, {key: BY_NAME[key].env})
    with pytest.raises(ConfigError) as info:
        resolve([layer])
    assert str(info.value).startswith(message)
    assert info.value.origin == BY_NAME[key].env


def test_bounds_are_inclusive_where_they_say_so() -> None:
    layer = Layer("environment", 200, {"lease_seconds": "1", "wait_timeout": "2592000", "max_workers": "4096",
                                       "node_id": "n" * 64})
    policy = resolve([layer])
    assert (policy.lease_seconds, policy.wait_timeout, policy.max_workers) == (1.0, 2592000.0, 4096)
    assert resolve([Layer("e", 200, {"lease_seconds": 86400})]).lease_seconds == 86400.0


def test_a_toml_integer_too_large_for_a_float_is_a_config_error() -> None:
    # TOML integers are unbounded in tomllib: float(10**400) raises OverflowError, not ValueError.
    layer = Layer("file", 100, {"wait_timeout": 10**400}, {"wait_timeout": "f.toml: wait_timeout"})
    with pytest.raises(ConfigError, match="f.toml: wait_timeout=1000"):
        resolve([layer])


def test_the_host_name_becomes_a_valid_node_id() -> None:
    from sharedfs.model.settings import BY_NAME, default_node_id

    assert BY_NAME["node_id"].parse(default_node_id()) == default_node_id()


def test_values_are_normalised() -> None:
    layer = Layer("environment", 200, {"lock": " SOFT ", "max_workers": "4", "strict": "yes", "disable": "wids, Datasets"})
    policy = resolve([layer])
    assert (policy.lock, policy.max_workers, policy.strict, policy.disable) == ("soft", 4, True, ("datasets", "wids"))
    assert resolve([Layer("e", 200, {"disable": "1"})]).disable == ("all",)


def test_policy_is_immutable_and_json_ready() -> None:
    import json

    policy = resolve([])
    with pytest.raises(AttributeError):
        policy.lock = "soft"  # type: ignore[misc]
    assert json.loads(json.dumps(policy.as_dict()))["lock"] == {"value": "auto", "source": "default"}


def test_slurm_node_name_is_the_node_id_unless_sharedfs_node_id_is_set(fresh_runtime, monkeypatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert fresh_runtime.policy().node_id == "n7"
    fresh_runtime.runtime._state = None
    monkeypatch.setenv("SHAREDFS_NODE_ID", "explicit")
    policy = fresh_runtime.policy()
    assert (policy.node_id, policy.source("node_id")) == ("explicit", "SHAREDFS_NODE_ID")


def test_configure_overrides_the_environment_and_rejects_bad_values(fresh_runtime, monkeypatch) -> None:
    monkeypatch.setenv("SHAREDFS_LOCK", "posix")
    assert fresh_runtime.policy().lock == "posix"
    assert fresh_runtime.configure(lock="soft").lock == "soft"
    assert fresh_runtime.policy().source("lock") == "argument lock"
    with pytest.raises(ConfigError, match="argument lock='nope' is not valid"):
        fresh_runtime.configure(lock="nope")
    assert fresh_runtime.policy().lock == "soft"  # a rejected call changes nothing


@pytest.mark.parametrize("raw", ["1", " TRUE ", "all", "1,datasets", "datasets, ALL", "datasets", "wids,0", "", " , "])
def test_the_bootstrap_and_the_policy_read_disable_alike(raw: str) -> None:
    """One parser for every source: the bootstrap (which installs nothing when everything is disabled) and
    the policy agree.  Before, the bootstrap compared the whole value with its true values: ``1,datasets``
    installed the finder while the policy read ``("all",)``."""
    import _sharedfs_bootstrap as bootstrap

    policy = resolve([Layer("environment", 200, {"disable": raw} if raw.strip() else {})])
    assert bootstrap.disabled_entirely({"SHAREDFS_DISABLE": raw}) == (policy.disable == ("all",)), policy.disable
