"""The skip policy of helpers.py: a test this machine cannot run skips, except under TFSHARD_CI=1, where it fails."""

import pytest
from helpers import require, skip_unless_ci

# Both outcomes are caught, so a policy that skips where it should fail shows as a failure here, not as a skip.
OUTCOMES = (pytest.skip.Exception, pytest.fail.Exception)


def _set_ci(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv("TFSHARD_CI", raising=False)
    else:
        monkeypatch.setenv("TFSHARD_CI", value)


@pytest.mark.parametrize("value", [None, "", "0", "true"], ids=["unset", "empty", "zero", "true"])
def test_outside_ci_a_missing_feature_skips_with_its_reason(monkeypatch, value):
    _set_ci(monkeypatch, value)
    for call in (lambda: require(False, "no unshare(1) here"), lambda: skip_unless_ci("no unshare(1) here")):
        with pytest.raises(OUTCOMES) as caught:
            call()
        assert caught.type is pytest.skip.Exception and caught.value.msg == "no unshare(1) here"


def test_under_ci_a_missing_feature_fails_naming_the_policy(monkeypatch):
    _set_ci(monkeypatch, "1")
    for call in (lambda: require(False, "no unshare(1) here"), lambda: skip_unless_ci("no unshare(1) here")):
        with pytest.raises(OUTCOMES) as caught:
            call()
        assert caught.type is pytest.fail.Exception
        assert caught.value.msg == "no unshare(1) here (CI must run this test: TFSHARD_CI=1)"


@pytest.mark.parametrize("value", [None, "1"], ids=["unset", "ci"])
def test_a_feature_that_is_there_neither_skips_nor_fails(monkeypatch, value):
    _set_ci(monkeypatch, value)
    assert require(True, "never said") is None
