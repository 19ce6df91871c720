"""Patcher and Shim: every patch is reversible, idempotent, and never left half-applied."""

from __future__ import annotations

import sys
import types

import pytest

from sharedfs._policy import resolve
from sharedfs.shim import Patcher, Shim


class Base:
    inherited = "base"


def test_patcher_restores_own_inherited_and_missing_attributes_and_items() -> None:
    class Child(Base):
        own = "own"

    mapping = {"kept": 1}
    patcher = Patcher()
    patcher.setattr(Child, "own", "x")
    patcher.setattr(Child, "inherited", "x")
    patcher.setattr(Child, "new", "x")
    patcher.setitem(mapping, "kept", 2)
    patcher.setitem(mapping, "added", 3)
    assert (Child.own, Child.inherited, Child.new, mapping) == ("x", "x", "x", {"kept": 2, "added": 3})
    assert patcher.changes() == ["Child.own", "Child.inherited", "Child.new", "dict['kept']", "dict['added']"]
    patcher.restore()
    assert Child.own == "own" and "inherited" not in vars(Child) and Child.inherited == "base"
    assert not hasattr(Child, "new") and mapping == {"kept": 1}


class FakeFrameworkShim(Shim):
    name = target = distribution = "fake_framework_for_shim_test"
    supported = ">=1"
    calls = 0

    def apply(self, module, policy):
        type(self).calls += 1
        self.patcher.setattr(module, "value", policy.lock)
        if policy.lock == "lease":
            raise RuntimeError("half-way")
        self.patcher.setattr(module, "other", 1)


@pytest.fixture
def module():
    mod = types.ModuleType(FakeFrameworkShim.target)
    mod.value = "original"
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_patch_is_idempotent_reapplies_on_new_policy_and_unpatch_restores(module) -> None:
    shim = FakeFrameworkShim()
    soft = resolve([]).__class__(**{**resolve([]).__dict__, "lock": "soft"})
    shim.patch(soft)
    shim.patch(soft)
    assert FakeFrameworkShim.calls == 1 and module.value == "soft" and shim.applied
    posix = soft.__class__(**{**soft.__dict__, "lock": "posix"})
    shim.patch(posix)
    assert module.value == "posix" and FakeFrameworkShim.calls == 2
    shim.unpatch()
    assert module.value == "original" and not hasattr(module, "other") and not shim.applied


def test_a_failing_apply_leaves_nothing_behind(module) -> None:
    shim = FakeFrameworkShim()
    lease = resolve([]).__class__(**{**resolve([]).__dict__, "lock": "lease"})
    with pytest.raises(RuntimeError):
        shim.patch(lease)
    assert module.value == "original" and not shim.applied
